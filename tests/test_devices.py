import pytest
import torch

from helpers import devices


def test_machine_info_reads_this_machine():
    info = devices.machine_info()
    assert info.gpu_count == 0  # tests hide GPUs (conftest)
    assert info.cpu_cores >= 1 and info.gloo_available
    assert "CPU core" in info.describe()


def test_fallback_repeats_one_device_and_says_so(capsys):
    devs = devices.lesson_devices(3)
    assert devs == [torch.device("cpu")] * 3
    assert devices.is_simulated(devs)
    assert "simulated" in capsys.readouterr().out


def test_distinct_gpus_when_there_are_enough(monkeypatch, capsys):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda d=None: "FakeGPU")
    devs = devices.lesson_devices(2)
    assert devs == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert not devices.is_simulated(devs)
    assert "real device" in capsys.readouterr().out
    # more than the GPUs: one GPU repeated, labelled simulated
    assert devices.lesson_devices(4, verbose=False) == [torch.device("cuda", 0)] * 4
    assert devices.lesson_devices(2, prefer="cpu", verbose=False) == [torch.device("cpu")] * 2


@pytest.mark.parametrize("n", [0, -1, 2.0])
def test_bad_counts_name_the_value(n):
    with pytest.raises(ValueError, match=f"n={n!r}"):
        devices.lesson_devices(n)


def test_more_devices_than_can_be_simulated():
    with pytest.raises(ValueError, match=r"n=9 devices requested.*valid: n <= 8"):
        devices.lesson_devices(9)


def test_cuda_required_but_absent_and_unknown_preference():
    with pytest.raises(RuntimeError, match="no CUDA GPU; valid choices"):
        devices.lesson_devices(1, prefer="cuda")
    with pytest.raises(ValueError, match="unknown device preference 'tpu'"):
        devices.lesson_devices(1, prefer="tpu")
