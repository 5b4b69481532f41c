"""The release version of both distributions, ``mgpu-migrate`` and ``mgpu-runtime``: the one place it is written.

``runtime/mgpu_runtime/_version.py`` is a symbolic link to this file (an sdist carries its content), so the tool
and the runtime it writes calls to are released together. A release is tagged ``v`` + this version
(``CHANGELOG.md``; pre-commit's ``rev:`` names the tag).
"""

__version__ = "0.1.0"
