"""Tests compare against outputs stored in the small profile on the CPU: force both."""

import os

os.environ["TUTORIAL_PROFILE"] = "small"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
