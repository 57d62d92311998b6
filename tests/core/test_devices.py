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


def test_machine_description():
    info = devices.MachineInfo("2.9", "12.1", 2, ["A100", "H100"], 8, True, True)
    assert info.describe() == (
        "torch 2.9; 2 GPU(s): A100, H100; 8 CPU core(s); backends: gloo, nccl"
    )
    bare = devices.MachineInfo("2.9", None, 0, [], 1, False, False)
    assert bare.describe() == "torch 2.9; 0 GPU(s): no CUDA GPU; 1 CPU core(s); backends: none"


def test_machine_info_reads_torch_and_the_gpus(monkeypatch):
    dist = devices.dist
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda i=None: f"gpu{i}")
    for count, nccl in ((0, False), (1, True), (2, True)):
        monkeypatch.setattr(devices, "gpu_count", lambda c=count: c)
        info = devices.machine_info()
        assert info.gpu_names == [f"gpu{i}" for i in range(count)]
        assert (info.gpu_count, info.nccl_available, info.gloo_available) == (count, nccl, False)
        assert info.torch_version == torch.__version__
        assert info.cuda_version == torch.version.cuda
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert not devices.machine_info().nccl_available  # GPUs, but no NCCL built in
    monkeypatch.setattr(dist, "is_available", lambda: False)
    monkeypatch.setattr(dist, "is_gloo_available", lambda: True)
    assert not devices.machine_info().gloo_available  # no torch.distributed at all


def test_cpu_cores_and_gpu_count_fallbacks(monkeypatch):
    monkeypatch.delattr(devices.os, "sched_getaffinity")
    monkeypatch.setattr(devices.os, "cpu_count", lambda: None)
    assert devices.cpu_cores() == 1
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 3)
    assert devices.cpu_cores() == 3
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    assert devices.gpu_count() == 0
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    assert devices.gpu_count() == 4


def test_resolve_dtype_and_device_edges(fake_gpus):
    with pytest.raises(ValueError, match=r"unknown dtype torch\.int8"):
        devices.resolve_dtype(torch.int8)
    assert devices.resolve_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match=r"^unknown device 'meta'; valid choices here: cpu$"):
        devices.resolve_device("meta")
    with pytest.raises(ValueError, match=r"^unknown device 'gpu0'; valid choices here: cpu$"):
        devices.resolve_device("gpu0")
    assert devices.resolve_device("cpu:0") == torch.device("cpu", 0)
    fake_gpus(2)
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(
        ValueError,
        match=r"^device 'cuda:2' does not exist: this machine has 2 GPU\(s\); "
        r"valid here: cpu, cuda, cuda:0 \.\. cuda:1$",
    ):
        devices.resolve_device("cuda:2")
    with pytest.raises(ValueError, match=r"valid choices here: cpu, cuda, cuda:0 \.\. cuda:1$"):
        devices.resolve_device("tpu")


def test_in_process_plans(fake_gpus):
    plan = devices.plan_devices(8)
    assert plan.devices == [CPU] * 8 and plan.dtype == torch.float32  # 8 is still allowed
    assert plan.reason == (
        "8 logical devices on cpu (simulated: one CPU stands in for all 8, "
        "because this machine has 0 GPU(s))"
    )
    fake_gpus(1)
    plan = devices.plan_devices(3)
    assert plan.devices == [torch.device("cuda", 0)] * 3 and plan.dtype == torch.float32
    assert plan.reason == (
        "3 logical devices on cuda:0 (simulated: one GPU cuda:0 stands in for all 3, "
        "because this machine has 1 GPU(s))"
    )
    fake_gpus(2)
    plan = devices.plan_devices(2)
    assert plan.dtype == torch.float32 and plan.reason == "2 real device(s): one GPU each"
    assert devices.plan_devices(1, device="cuda:1").device_type == "cuda"


@pytest.mark.parametrize(
    "gpus,n,device,backend,reason",
    [
        (0, 2, "auto", "auto", "gloo on the CPU: this machine has no CUDA GPU"),
        (4, 4, "auto", "gloo", "gloo on the CPU, as requested"),
        (4, 2, "cpu", "auto", "gloo on the CPU, as requested"),
        (
            1,
            2,
            "auto",
            "auto",
            "gloo on the CPU: 2 ranks but only 1 GPU(s), and NCCL refuses two ranks on "
            "one GPU ('Multiple Ranks are using the same GPU')",
        ),
        (4, 2, "auto", "auto", "nccl: one GPU per rank (2 of 4 GPUs)"),
    ],
)
def test_process_plan_reasons(fake_gpus, gpus, n, device, backend, reason):
    fake_gpus(gpus)
    assert devices.plan_devices(n, processes=True, device=device, backend=backend).reason == reason


def test_process_refusals_offer_only_the_alternatives_that_exist(fake_gpus):
    fake_gpus(4)
    with pytest.raises(ValueError) as error:
        devices.plan_devices(2, processes=True, device="cpu", backend="nccl")
    assert str(error.value) == (
        "backend 'nccl' needs one GPU per rank (--device cpu was asked for); NCCL refuses two "
        "ranks on one GPU ('Multiple Ranks are using the same GPU'); valid: backend 'gloo' (CPU)"
    )
    fake_gpus(0)
    with pytest.raises(
        ValueError, match=r"0 GPU\(s\) for 1 ranks\).*valid: backend 'gloo' \(CPU\)$"
    ):
        devices.plan_devices(1, processes=True, backend="nccl")
    fake_gpus(1)
    with pytest.raises(ValueError, match=r"valid: device 'cpu' or 'auto', or at most 1 ranks$"):
        devices.plan_devices(2, processes=True, device="cuda")
