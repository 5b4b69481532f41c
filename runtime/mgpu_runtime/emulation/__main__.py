"""``python -m mgpu_runtime.emulation``: see ``runner``."""

from mgpu_runtime.emulation.runner import main

main()
