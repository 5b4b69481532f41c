"""nn.DataParallel on W devices, emulated on the CPU: the reference of the runtime's exactness contract.

* ``devices``: W CUDA devices on the CPU (the device count, one random stream per device, the CUDA
  seeding functions); also what the runtime's CPU paths use to show a script W devices.
* ``data_parallel``: torch's DataParallel (and its functional form ``data_parallel.data_parallel``), scatter,
  replicate, apply and gather, on those devices; ``install(count)`` puts them in torch's place.
* ``python -m mgpu_runtime.emulation``: runs a script under them (``runner``), stops it after N optimizer
  steps and writes the wrapped models' state; ``python -m mgpu_runtime.emulation.compare`` compares two
  such states. ``mgpu-migrate verify`` is built on both.
"""

# The functional ``data_parallel`` stays in its module: exported here, it would hide the module of that name.
from mgpu_runtime.emulation.data_parallel import DataParallel, install, uninstall

__all__ = ["DataParallel", "install", "uninstall"]
