"""The one device/backend/dtype decision, as a table over faked GPU counts."""

import pytest
import torch

from helpers.core import devices

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def fake_gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(devices, "gpu_count", lambda: n)
        monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda d=None: "FakeGPU")

    return set_count


def test_machine_info_reads_this_machine():
    info = devices.machine_info()
    assert info.gpu_count == 0  # tests hide GPUs (conftest)
    assert info.cpu_cores == len(__import__("os").sched_getaffinity(0))
    assert info.gloo_available and "CPU core" in info.describe()


# (gpus, n, device, backend) -> (backend, device type, dtype, distinct devices)
PROCESS_TABLE = [
    (0, 1, "auto", "auto", "gloo", "cpu", torch.float32),
    (0, 4, "auto", "auto", "gloo", "cpu", torch.float32),
    (1, 1, "auto", "auto", "nccl", "cuda", torch.float16),  # exactly one GPU per rank
    (1, 2, "auto", "auto", "gloo", "cpu", torch.float32),  # two ranks, one GPU: no NCCL
    (2, 2, "auto", "auto", "nccl", "cuda", torch.float16),
    (4, 2, "auto", "nccl", "nccl", "cuda", torch.float16),
    (4, 4, "auto", "gloo", "gloo", "cpu", torch.float32),
    (4, 4, "cpu", "auto", "gloo", "cpu", torch.float32),
    (8, 8, "cuda", "auto", "nccl", "cuda", torch.float16),
]


@pytest.mark.parametrize("gpus,n,device,backend,want_backend,want_type,want_dtype", PROCESS_TABLE)
def test_process_decision_table(
    fake_gpus, gpus, n, device, backend, want_backend, want_type, want_dtype
):
    fake_gpus(gpus)
    plan = devices.plan_devices(n, processes=True, device=device, backend=backend)
    assert (plan.backend, plan.device_type, plan.dtype) == (want_backend, want_type, want_dtype)
    assert len(plan.devices) == n
    if want_backend == "nccl":
        assert plan.devices == [torch.device("cuda", k) for k in range(n)] and not plan.simulated
    if gpus and 0 < gpus < n and backend == "auto" and device == "auto":
        assert "Multiple Ranks are using the same GPU" in plan.reason


@pytest.mark.parametrize(
    "gpus,n,device,backend,message",
    [
        (
            1,
            2,
            "auto",
            "nccl",
            r"needs one GPU per rank \(1 GPU\(s\) for 2 ranks\).*or at most 1 ranks",
        ),
        (0, 1, "auto", "nccl", r"needs one GPU per rank.*valid: backend 'gloo'"),
        (4, 2, "cpu", "nccl", r"--device cpu was asked for"),
        (1, 2, "cuda", "auto", r"device 'cuda' for 2 ranks needs one GPU per rank"),
        (0, 1, "cuda", "auto", r"needs a CUDA GPU but this machine has none"),
        (2, 1, "auto", "mpi", r"unknown backend 'mpi'; valid choices: auto, gloo, nccl"),
        (2, 1, "tpu", "auto", r"device 'tpu'; valid choices: auto, cpu, cuda"),
    ],
)
def test_refusals_name_the_value_and_the_valid_choices(
    fake_gpus, gpus, n, device, backend, message
):
    fake_gpus(gpus)
    with pytest.raises(ValueError, match=message):
        devices.plan_devices(n, processes=True, device=device, backend=backend)


def test_in_process_fallback_repeats_one_device_and_says_so(capsys):
    devs = devices.lesson_devices(3)
    assert devs == [CPU] * 3
    assert devices.plan_devices(3).simulated
    assert "simulated" in capsys.readouterr().out


def test_in_process_distinct_gpus_when_there_are_enough(fake_gpus, capsys):
    fake_gpus(2)
    assert devices.lesson_devices(2) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert "real device" in capsys.readouterr().out
    assert not devices.plan_devices(2).simulated
    assert devices.lesson_devices(4, verbose=False) == [CUDA] * 4  # more than the GPUs
    assert devices.lesson_devices(2, device="cpu", verbose=False) == [CPU] * 2


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_bad_counts_name_the_value(n):
    with pytest.raises(ValueError, match=f"n={n!r}"):
        devices.lesson_devices(n)


def test_more_devices_than_can_be_simulated():
    with pytest.raises(ValueError, match=r"n=9 devices requested.*valid: n <= 8"):
        devices.lesson_devices(9)


@pytest.mark.parametrize(
    "name,message",
    [("cuda:3", "needs a CUDA GPU"), ("tpu", "unknown device 'tpu'"), ("float8", None)],
)
def test_resolve_device_and_dtype(name, message):
    if message is None:
        with pytest.raises(
            ValueError, match="unknown dtype 'float8'; valid choices: float32, float16, bfloat16"
        ):
            devices.resolve_dtype(name)
    else:
        with pytest.raises(ValueError, match=message):
            devices.resolve_device(name)
    assert devices.resolve_dtype("float16") is torch.float16
    assert devices.dtype_name(torch.bfloat16) == "bfloat16"
