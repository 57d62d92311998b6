"""``python -m course_tools.gpu_check`` (``make gpu-check``): every lesson's proof and
measurement on a CUDA machine; see ``course_tools.gpu_check.cli``."""

import sys

from course_tools.gpu_check.cli import main

sys.exit(main())
