"""``python -m helpers.gpu_check``: the same as ``python -m helpers.tools.gpu_check``."""

import sys

from helpers.gpu_check.cli import main

sys.exit(main())
