"""The unit tests keep whatever their launches log under pytest's temporary folder."""

import os

import pytest

from helpers.distributed.launcher import LOG_DIR_ENV


@pytest.fixture(autouse=True, scope="session")
def launch_logs_in_a_temporary_folder(tmp_path_factory):
    previous = os.environ.get(LOG_DIR_ENV)
    os.environ[LOG_DIR_ENV] = str(tmp_path_factory.mktemp("launch-logs"))
    yield
    if previous is None:
        os.environ.pop(LOG_DIR_ENV, None)
    else:
        os.environ[LOG_DIR_ENV] = previous
