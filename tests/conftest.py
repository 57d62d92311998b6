"""The unit tests keep whatever their launches log under pytest's temporary folder; a
one-rank gloo process group for the tests that need ``torch.distributed`` in this process."""

import os

import pytest
import torch.distributed as dist

from helpers.torchrun.launcher import LOG_DIR_ENV, free_port


@pytest.fixture(autouse=True, scope="session")
def launch_logs_in_a_temporary_folder(tmp_path_factory):
    previous = os.environ.get(LOG_DIR_ENV)
    os.environ[LOG_DIR_ENV] = str(tmp_path_factory.mktemp("launch-logs"))
    yield
    if previous is None:
        os.environ.pop(LOG_DIR_ENV, None)
    else:
        os.environ[LOG_DIR_ENV] = previous


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone (world size 1), destroyed afterwards."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()
