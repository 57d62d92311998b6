"""``make bench``'s memory section: measured and estimated ledgers of every course model."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.memory.estimate import estimate_training_memory
from helpers.memory.ledger import compare_ledgers
from helpers.memory.measure import measure_training_memory


def _cases() -> dict[str, Callable[[], tuple]]:
    """Name -> builder of (model, inputs, labels, parts, what to estimate, estimate options)."""
    from helpers.model_parallel.resnet import (
        model_parallel_resnet50,
        one_hot_labels,
        resnet50,
        resnet_layers,
    )
    from helpers.models.llama import LMConfig, build_lm
    from helpers.models.toy import ToyModel
    from helpers.tensor_parallel.ffn import FeedForward, cut_shard

    g = torch.Generator().manual_seed(0)
    cpu = [torch.device("cpu")] * 2

    def toy(split: bool) -> tuple:
        model = ToyModel("cpu", "cpu", 10000, 10, 5)
        parts = {"dev0": model.net1, "dev1": model.net2} if split else {"one device": model}
        x, y = torch.rand(64, 10000, generator=g), torch.randn(64, 5, generator=g)
        chain = model if split else [model.net1, model.relu, model.net2]
        return model, x, y, parts, chain, {"sample_shape": (10000,)}

    def resnet(split: bool) -> tuple:
        model = model_parallel_resnet50(cpu) if split else resnet50()
        parts = {f"stage {k}": s for k, s in enumerate(model.stages)} if split else {"cpu": model}
        x = torch.randn(32, 3, 128, 128, generator=g)
        labels = one_hot_labels(torch.arange(32) % 1000, 1000)
        chain = model if split else resnet_layers(model)  # torchvision's ResNet: its layer list
        return model, x, labels, parts, chain, {"sample_shape": (3, 128, 128)}

    def ffn(p: int) -> tuple:
        torch.manual_seed(1)
        full = FeedForward(512, 4096, "gelu")
        model = cut_shard(full, p, 0, "gelu") if p > 1 else full
        x, y = torch.randn(8, 512, 512, generator=g), torch.randn(8, 512, 512, generator=g)
        return model, x, y, {f"rank 0 of {p}": model}, model, {"sample_shape": (512, 512)}

    def llama() -> tuple:
        model = build_lm(LMConfig(vocab=4096, hidden=256, blocks=4, ffn=1024, heads=4))
        ids = torch.randint(0, 4096, (8, 128), generator=g)
        return model, ids, ids.roll(-1, dims=1), {"one device": model}, model, {"seq": 128}

    return {
        "toy, one device": lambda: toy(False),
        "toy, two devices": lambda: toy(True),
        "resnet50 batch 32 at 128x128, one device": lambda: resnet(False),
        "resnet50 batch 32 at 128x128, two stages": lambda: resnet(True),
        **{
            f"ffn 512x4096, seq 512, batch 8, tensor parallel {p}": (lambda p=p: ffn(p))
            for p in (1, 2, 4)
        },
        "small llama, 4 blocks of 256, 8 x 128 tokens": llama,
    }


def memory_section(optimizer: str = "adam") -> dict:
    """For each course model and strategy: measured and estimated bytes per device, their ratio."""
    out = {"optimizer": optimizer, "cases": {}}
    for name, build in _cases().items():
        model, x, y, parts, chain, options = build()
        estimated = estimate_training_memory(
            chain, batch=x.shape[0], optimizer=optimizer, names=list(parts), **options
        )
        measured = measure_training_memory(model, x, y, optimizer=optimizer, parts=parts)
        rows = compare_ledgers(measured, estimated)
        out["cases"][name] = rows
        worst = max(abs(r["ratio"] - 1) for r in rows)
        print(f"  {name}: estimate/measured within {worst:.2%}", flush=True)
    out["all_parameter_state_exact"] = all(
        r["ratio"] == 1.0
        for rows in out["cases"].values()
        for r in rows
        if r["kind"] != "activations"
    )
    return out
