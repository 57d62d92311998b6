"""``python -m helpers.tools.gpu_check`` (``make gpu-check``): see ``helpers.gpu_check``."""

import sys

from helpers.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
