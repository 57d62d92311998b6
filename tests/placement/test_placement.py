import copy

import pytest
import torch
from accelerate import init_empty_weights
from accelerate.utils import convert_file_size_to_int
from torch import nn

from helpers.core.errors import DoesNotFitError, FolderError
from helpers.core.files import MANIFEST
from helpers.core.sizes import parameter_count
from helpers.model_parallel.resnet import resnet50
from helpers.models.llama import LLAMA_7B, LMConfig, TinyLM, build_lm
from helpers.placement.offload import (
    accelerate_balanced_memory,
    accelerate_device_map,
    disk_tensors,
    dispatch_with_offload,
    parameter_listing,
    remove_offload_folder,
    write_offload_folder,
)
from helpers.placement.planner import (
    device_of,
    largest_layer,
    map_differences,
    parts_of,
    plan_device_map,
    tensor_devices,
)
from helpers.placement.sizing import module_sizes, parse_budgets, parse_size
from helpers.placement.strategies import STRATEGIES, balanced_budgets
from helpers.runs.placement.report import plot_plans, usage_table

CONFIG = LMConfig(vocab=512, hidden=64, blocks=4, ffn=256, heads=2)
PLAIN = {"strategy": "sequential", "reserve_largest_layer": False}  # the fill alone, in order


@pytest.fixture(scope="module")
def lm() -> TinyLM:
    return build_lm(CONFIG, seed=0)


def sizes_of(model: nn.Module) -> dict[str, int]:
    return module_sizes(model)


# ---- budgets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size", ["10GiB", "10GB", "500MB", "1.5GiB", ".5MB", "7KiB", "3KB", "10 GiB", "10gib", 0, 4096]
)
def test_sizes_are_read_as_accelerate_reads_them(size):
    assert parse_size(size) == convert_file_size_to_int(size)


def test_decimal_and_binary_units_differ():
    assert parse_size("10GB") == 10 * 10**9
    assert parse_size("10GiB") == 10 * 2**30


@pytest.mark.parametrize("bad", ["abc", "10", "-5GB", "10TB", "", "GB", 5.0, None, True, -1])
def test_malformed_size_names_the_value_and_the_valid_forms(bad):
    with pytest.raises(ValueError) as error:
        parse_size(bad, what="max_memory['cpu']")
    message = str(error.value)
    assert f"max_memory['cpu'] = {bad!r}" in message
    assert "'GiB'" in message and "'GB'" in message and "int number of bytes" in message


@pytest.mark.parametrize("bits", ["10Gb", "10gb", "500mb"])
def test_lowercase_b_is_refused_because_accelerate_reads_bits(bits):
    assert convert_file_size_to_int(bits) * 8 == pytest.approx(parse_size(bits.upper()), abs=8)
    with pytest.raises(ValueError, match=f"{bits!r} ends in a lowercase 'b'.*bits.*valid forms"):
        parse_size(bits)


@pytest.mark.parametrize(
    ("device", "hint"), [("cuda:0", "int 0"), ("0", "int 0"), ("gpu", "valid"), (-1, "valid")]
)
def test_unknown_device_names_the_value_and_the_valid_devices(device, hint):
    with pytest.raises(ValueError, match=rf"unknown device {device!r}.*{hint}") as error:
        parse_budgets({device: "1GB"})
    assert "'cpu' and 'disk'" in str(error.value)


def test_budgets_are_ordered_gpus_then_cpu_then_disk():
    budgets = parse_budgets({"disk": "1GB", "cpu": 5, 1: "1MB", 0: 7})
    assert list(budgets) == [0, 1, "cpu", "disk"]
    assert budgets == {0: 7, 1: 10**6, "cpu": 5, "disk": 10**9}


def test_empty_budget_is_refused(lm):
    with pytest.raises(ValueError, match="max_memory is empty"):
        plan_device_map(lm, {})


def test_size_messages_name_the_value_and_what_is_missing():
    with pytest.raises(ValueError, match=r"^size = 'abc' is not a size; valid forms: an int"):
        parse_size("abc")
    with pytest.raises(
        ValueError, match=r"^size = ' 10 ' is not a size \(a string needs a unit\);"
    ):
        parse_size(" 10 ")
    with pytest.raises(ValueError, match=r"^size = 2\.5 is a float; valid forms"):
        parse_size(2.5)
    with pytest.raises(ValueError, match=r"write '10GB' for bytes;"):
        parse_size("10Gb")
    with pytest.raises(ValueError, match=r"^max_memory\['cpu'\] = 'lots' is not a size;"):
        parse_budgets({"cpu": "lots"})
    with pytest.raises(ValueError, match=r"^unknown device 'gpu' in max_memory; valid: GPU"):
        parse_budgets({"gpu": 1})


# ---- the planner ---------------------------------------------------------------------


def test_sizes_come_from_parameters_and_buffers_by_dtype():
    bn = nn.BatchNorm1d(
        10
    )  # weight, bias, running mean/var (float32) + num_batches_tracked (int64)
    sizes = module_sizes(nn.Sequential(bn))
    assert sizes["0"] == 4 * 10 * 4 + 8
    assert module_sizes(nn.Sequential(bn), torch.float16)["0"] == 4 * 10 * 2 + 8  # ints keep theirs
    half = nn.Linear(4, 4).half()
    assert module_sizes(half)[""] == (16 + 4) * 2
    assert module_sizes(half, torch.float32)[""] == (16 + 4) * 2  # a dtype never enlarges


def test_everything_fits_on_the_first_device(lm):
    plan = plan_device_map(lm, {0: "1GB", "cpu": "1GB"})
    assert set(plan.device_map.values()) == {0}
    assert list(plan.device_map) == ["embed", "blocks", "norm", "head"]
    assert plan.used[0] == sizes_of(lm)[""]


def test_fills_devices_in_order_with_whole_blocks(lm):
    sizes = sizes_of(lm)
    block, embed = sizes["blocks.0"], sizes["embed"]
    plan = plan_device_map(lm, {"disk": 10**9, 1: 2 * block + 100, 0: embed + block + 100}, **PLAIN)
    assert plan.on(0) == ["embed", "blocks.0"]
    assert plan.on(1) == ["blocks.1", "blocks.2"]
    assert plan.on("disk") == ["blocks.3", "norm", "head"]
    for device, budget in plan.budgets.items():
        assert plan.used[device] <= budget
    assert set(tensor_devices(lm, plan.device_map).values()) == {0, 1, "disk"}


def test_splits_a_module_that_does_not_fit_unless_unsplittable(lm):
    sizes = sizes_of(lm)
    budget = {0: sizes["embed"] + sizes["blocks.0"] // 2, "cpu": 10**9}
    whole = plan_device_map(lm, budget, **PLAIN)  # TinyLM marks Block unsplittable
    assert whole.device_map["blocks.0"] == "cpu"
    assert not any(name.startswith("blocks.0.") for name in whole.device_map)
    cut = plan_device_map(lm, budget, no_split=[], **PLAIN)
    parts = {n: d for n, d in cut.device_map.items() if n.startswith("blocks.0.")}
    assert "blocks.0" not in cut.device_map
    assert parts["blocks.0.attn_norm"] == 0 and parts["blocks.0.attn"] == 0
    assert set(parts.values()) == {0, "cpu"}  # the block is cut across the two devices


def test_a_budget_in_which_nothing_fits_names_the_module_and_what_to_do(lm):
    with pytest.raises(
        DoesNotFitError, match=r"'embed' \(Embedding.*'cpu': '1KB'.*add \(or enlarge\) 'disk'"
    ):
        plan_device_map(lm, {"cpu": "1KB"})
    block = sizes_of(lm)["blocks.0"]
    with pytest.raises(DoesNotFitError, match=r"'blocks.0' \(Block.*room for it"):
        plan_device_map(lm, {0: sizes_of(lm)["embed"], "cpu": block - 1}, **PLAIN)


def test_reserve_holds_back_the_largest_layer_on_main_devices(lm):
    sizes = sizes_of(lm)
    block = sizes["blocks.0"]  # the largest layer of this model (larger than the embedding)
    assert block > sizes["embed"] and block > sizes["head"]
    budget = {0: sizes["embed"] + 3 * block, 1: 10**9}
    plain = plan_device_map(lm, budget, **PLAIN)
    reserved = plan_device_map(lm, budget, strategy="sequential")
    assert plain.on(0) == ["embed", "blocks.0", "blocks.1", "blocks.2"]
    assert reserved.on(0) == ["embed", "blocks.0", "blocks.1"]  # room for one block held back
    assert reserved.reserved[0] == block and 1 not in reserved.reserved  # GPU 1 is not main
    gpu1 = plan_device_map(lm, {1: sizes["embed"] + 3 * block, "cpu": 10**9})
    assert gpu1.on(1) == reserved.on(0) and gpu1.reserved[1] == block  # first GPU listed: main


class _Scaled(nn.Module):
    """Own parameter, a child with buffers, own buffer: parts come in that order."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.norm = nn.BatchNorm1d(2)
        self.register_buffer("step", torch.zeros(1))


def test_parts_and_sizes_of_a_module():
    assert [n for n, _ in parts_of(_Scaled())] == ["scale", "norm", "step"]
    assert [n for n, _ in parts_of(_Scaled(), "m")] == ["m.scale", "m.norm", "m.step"]
    sizes = module_sizes(nn.Linear(4, 4))
    assert sizes == {"": 80, "weight": 64, "bias": 16}
    assert largest_layer([], {}, []) == 0


def test_planner_on_a_model_without_no_split_modules_and_on_cpu_or_disk_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))  # 288 bytes each
    plan = plan_device_map(model, {"cpu": 1000}, reserve_largest_layer=True)
    assert plan.device_map == {"0": "cpu", "1": "cpu"}
    assert plan.reserved == {"cpu": 0}  # nothing left to place after the last layer
    assert plan.sizes == module_sizes(model)
    tight = plan_device_map(model, {"cpu": 500, "disk": 1000}, reserve_largest_layer=True)
    assert tight.device_map == {"0": "disk", "1": "disk"}  # the CPU holds room for layer 1
    assert tight.reserved == {"cpu": 288}
    on_disk = plan_device_map(model, {"disk": 576}, reserve_largest_layer=True)
    assert on_disk.device_map == {"0": "disk", "1": "disk"}
    assert on_disk.reserved == {}  # disk is never a main device


def test_device_of_an_unmapped_tensor_names_it_and_the_keys():
    assert device_of("a.b.weight", {"a": 0, "a.b": "cpu"}) == "cpu"
    assert device_of("z.weight", {"": "disk"}) == "disk"
    with pytest.raises(
        KeyError, match=r"'x\.y' is in no module of the device map \(keys: \['a'\]\)"
    ):
        device_of("x.y", {"a": 0})


# ---- agreement with accelerate -------------------------------------------------------

BUDGETS = [
    (0.4, 0.3, 0.25),
    (0.3, 0.3, 0.25),
    (0.2, 0.2, 0.2),
    (0.6, 0.0, 0.5),
    (2.0, 0.0, 0.0),
]


@pytest.mark.parametrize("fractions", BUDGETS)
@pytest.mark.parametrize("no_split", [["Block"], []])
def test_the_fill_agrees_with_infer_auto_device_map(lm, fractions, no_split):
    total = sizes_of(lm)[""]
    budget = {0: int(fractions[0] * total), 1: int(fractions[1] * total)}
    budget |= {"cpu": int(fractions[2] * total), "disk": 10 * total}
    ours = plan_device_map(lm, budget, strategy="sequential", no_split=no_split)
    theirs = accelerate_device_map(lm, budget, strategy="sequential", no_split=no_split)
    assert map_differences(lm, ours.device_map, theirs) == []


def test_agrees_with_accelerate_on_resnet50(models):
    model = models["ResNet50"]
    total = sizes_of(model)[""]
    for gpu in (0.3, 0.6):
        budget = {0: int(gpu * total), "cpu": int(0.3 * total), "disk": 4 * total}
        for no_split in (["Bottleneck"], []):
            ours = plan_device_map(model, budget, no_split=no_split)
            theirs = accelerate_device_map(model, budget, no_split=no_split)
            assert map_differences(model, ours.device_map, theirs) == []


def test_plain_planner_differs_from_accelerate_only_by_the_reserve(lm):
    total = sizes_of(lm)[""]
    budget = {0: int(0.45 * total), "cpu": int(0.3 * total), "disk": 10 * total}
    plain = plan_device_map(lm, budget, reserve_largest_layer=False)
    differences = map_differences(lm, plain.device_map, accelerate_device_map(lm, budget))
    assert differences  # accelerate keeps less on GPU 0 and the CPU
    order = {0: 0, "cpu": 1, "disk": 2}
    assert all(order[ours] < order[theirs] for _, ours, theirs in differences)


# ---- strategies: "auto" balances the GPUs, then fills; "sequential" only fills --------

# (model, GPU budgets, CPU budget or None, disk listed, unsplittable classes); budgets are
# fractions of the model's size, GPUs are hypothetical (planning is arithmetic only).
CASES = [
    ("TinyLM", (), 0.6, True, ["Block"]),
    ("TinyLM", (0.5,), 0.3, True, ["Block"]),
    ("TinyLM", (0.8,), 0.5, False, []),
    ("TinyLM", (1.0, 1.0), None, False, ["Block"]),
    ("TinyLM", (0.45, 0.35), 0.25, True, ["Block"]),
    ("TinyLM", (0.8, 0.4), 0.3, True, []),
    ("TinyLM", (0.6, 0.6, 0.6), 0.2, False, ["Block"]),
    ("TinyLM", (0.5, 0.5, 0.3), None, True, []),
    ("TinyLM", (0.5, 0.5, 0.5, 0.5), None, False, ["Block"]),
    ("TinyLM", (0.15, 0.2, 0.2, 0.15), 0.2, True, []),
    ("ResNet50", (0.4,), 0.3, True, ["Bottleneck"]),
    ("ResNet50", (1.0, 1.0), 0.3, False, ["Bottleneck"]),
    ("ResNet50", (0.6, 0.3), 0.2, True, []),
    ("ResNet50", (0.5, 0.5, 0.5), None, False, []),
    ("ResNet50", (0.5, 0.5, 0.5), 0.2, True, ["Bottleneck"]),
    ("ResNet50", (0.4, 0.4, 0.4, 0.4), 0.3, False, ["Bottleneck"]),
    ("ResNet50", (0.2, 0.2, 0.2, 0.2), None, True, []),
]


def case_id(case) -> str:
    name, gpus, cpu, disk, no_split = case
    devices = [f"gpu{g:.0%}" for g in gpus] + ([f"cpu{cpu:.0%}"] if cpu else [])
    return "-".join([name, *devices, *(["disk"] if disk else []), *no_split])


def budget_of(model: nn.Module, case) -> dict:
    _, gpus, cpu, disk, _ = case
    total = sizes_of(model)[""]
    budget = {i: int(g * total) for i, g in enumerate(gpus)}
    budget |= {"cpu": int(cpu * total)} if cpu else {}
    return budget | ({"disk": 10 * total} if disk else {})


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    lm8 = build_lm(LMConfig(vocab=512, hidden=64, blocks=8, ffn=256, heads=2), seed=0)
    return {"TinyLM": lm8, "ResNet50": resnet50()}


@pytest.fixture(scope="module")
def reference(models):
    """accelerate's map for (case, strategy), computed once per module."""
    cache: dict = {}

    def device_map(case, strategy: str) -> dict:
        key = (case_id(case), strategy)
        if key not in cache:
            model = models[case[0]]
            cache[key] = accelerate_device_map(
                model, budget_of(model, case), strategy=strategy, no_split=case[4]
            )
        return cache[key]

    return device_map


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hand_planner_agrees_with_transformers_recipe(models, reference, case, strategy):
    model, budget, no_split = models[case[0]], budget_of(models[case[0]], case), case[4]
    theirs = reference(case, strategy)
    try:
        ours = plan_device_map(model, budget, strategy=strategy, no_split=no_split)
    except DoesNotFitError:  # accelerate always adds an unlimited disk: it spilled there
        assert "disk" not in budget and "disk" in theirs.values()
        budget |= {"disk": 100 * sizes_of(model)[""]}
        ours = plan_device_map(model, budget, strategy=strategy, no_split=no_split)
    assert map_differences(model, ours.device_map, theirs) == []
    assert ours.max_memory == parse_budgets(budget) and ours.strategy == strategy
    if strategy == "sequential":
        assert ours.budgets == ours.max_memory
    else:
        low_zero = strategy == "balanced_low_0"
        hand = balanced_budgets(model, budget, low_zero=low_zero, no_split=no_split)
        acc = accelerate_balanced_memory(model, budget, low_zero=low_zero, no_split=no_split)
        assert ours.budgets == hand == acc


def test_the_strategies_matter_in_the_agreement_cases(models, reference):
    changed = {s: 0 for s in STRATEGIES}
    for case in CASES:
        model, sequential = models[case[0]], reference(case, "sequential")
        for strategy in STRATEGIES:
            other = reference(case, strategy)
            changed[strategy] += bool(map_differences(model, other, sequential))
            if len(case[1]) < 2:  # one GPU or none: nothing to balance
                assert map_differences(model, other, sequential) == []
    assert changed["sequential"] == 0
    assert min(changed["auto"], changed["balanced"], changed["balanced_low_0"]) >= 4, changed


def test_auto_and_sequential_differ_on_two_gpus_and_agree_on_one(lm):
    total = sizes_of(lm)[""]
    two = {0: total, 1: total}  # either GPU could hold the whole model
    sequential = plan_device_map(lm, two, strategy="sequential")
    auto = plan_device_map(lm, two)  # strategy="auto" is the default
    assert set(sequential.device_map.values()) == {0}  # in order: GPU 0 takes it all
    assert auto.on(0) and auto.on(1)  # balanced: both GPUs take a share
    assert auto.budgets[0] < total == auto.budgets[1]  # the last GPU keeps its budget
    assert map_differences(lm, auto.device_map, sequential.device_map)
    acc_auto, acc_sequential = (accelerate_device_map(lm, two, strategy=s) for s in STRATEGIES[::3])
    assert map_differences(lm, acc_auto, acc_sequential)
    assert map_differences(lm, auto.device_map, acc_auto) == []
    assert "max_memory" in usage_table(auto) and "max_memory" not in usage_table(sequential)
    one = {0: total // 2, "cpu": total}
    for strategy in STRATEGIES:
        plan = plan_device_map(lm, one, strategy=strategy)
        assert plan.budgets == plan.max_memory  # nothing to balance
        reference = plan_device_map(lm, one, strategy="sequential").device_map
        assert plan.device_map == reference
        assert not map_differences(lm, accelerate_device_map(lm, one, strategy=strategy), reference)


@pytest.mark.parametrize("bad", ["balance", "Auto", "", None, 0])
def test_unknown_strategy_names_the_value_and_the_valid_ones(lm, bad):
    valid = "valid: 'auto', 'balanced', 'balanced_low_0', 'sequential'"
    with pytest.raises(
        ValueError, match=rf"strategy = {bad!r} is not a device_map strategy; {valid}"
    ):
        plan_device_map(lm, {0: "1GB"}, strategy=bad)
    with pytest.raises(ValueError, match=rf"strategy = {bad!r}.*{valid}"):
        accelerate_device_map(lm, {0: "1GB"}, strategy=bad)


def test_balanced_low_0_needs_gpus_counted_from_0(lm):
    with pytest.raises(
        ValueError, match=r"GPUs \[1, 2\].*valid: budgets above 0 for GPUs \[0, 1\]"
    ):
        plan_device_map(lm, {1: "1GB", 2: "1GB"}, strategy="balanced_low_0")
    assert plan_device_map(lm, {1: "1GB", 2: "1GB"}).on(1)  # "auto" does not need GPU 0


def test_accelerate_cannot_balance_a_disk_budget_so_the_wrapper_sets_it_aside(lm):
    from accelerate.utils import get_balanced_memory

    budget = {0: "1MB", 1: "1MB", "disk": "1GB"}
    with pytest.raises(RuntimeError, match="disk"):
        get_balanced_memory(lm, dict(budget), no_split_module_classes=["Block"])
    balanced = accelerate_balanced_memory(lm, budget)
    assert balanced == balanced_budgets(lm, budget) and balanced["disk"] == 10**9


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_7b_on_the_meta_device_agrees_with_accelerate(dtype):
    with init_empty_weights():
        big = TinyLM(LLAMA_7B)
    assert parameter_count(big) == 6_738_415_616
    assert {p.device.type for p in big.parameters()} == {"meta"}
    budget = {0: "24GiB", "cpu": "64GiB", "disk": "2000GB"}
    ours = plan_device_map(big, budget, dtype=dtype)
    theirs = accelerate_device_map(big, budget, dtype=dtype)
    assert map_differences(big, ours.device_map, theirs) == []
    on_gpu = set(ours.device_map.values()) == {0}
    assert on_gpu == (dtype != torch.float32)  # 27 GB in float32 does not fit 24 GiB


def test_balanced_budgets_follow_accelerate_with_the_given_no_split_and_dtype():
    from accelerate.utils import get_balanced_memory

    from helpers.models.llama import LMConfig, build_lm

    lm = build_lm(LMConfig(vocab=512, hidden=64, blocks=4, ffn=256, heads=2), seed=0)
    total = module_sizes(lm)[""]
    asked = {0: total, 1: total, "cpu": total}
    for no_split, dtype in ((["Block"], None), ([], None), (["Block"], torch.float16)):
        plan = plan_device_map(lm, asked, strategy="balanced", no_split=no_split, dtype=dtype)
        reference = get_balanced_memory(
            lm, max_memory=dict(asked), no_split_module_classes=no_split, dtype=dtype
        )
        assert plan.budgets == reference and plan.strategy == "balanced"
        assert plan.max_memory == asked
    tight = {0: total, 1: total // 5}
    assert set(plan_device_map(lm, tight, strategy="sequential").device_map.values()) == {0}
    balanced = get_balanced_memory(lm, max_memory=dict(tight), no_split_module_classes=["Block"])
    with pytest.raises(DoesNotFitError) as error:
        plan_device_map(lm, tight)  # "auto" balances GPU 0 down first: the model no longer fits
    assert f"max_memory = {tight!r} (balanced by 'auto': {balanced!r}); valid:" in str(error.value)
    with pytest.raises(DoesNotFitError) as error:
        plan_device_map(lm, {0: total // 3, 1: total // 3})  # balancing changes nothing here
    assert f"max_memory = {dict.fromkeys((0, 1), total // 3)!r}; valid:" in str(error.value)


# ---- dispatch with disk offload ------------------------------------------------------


def test_dispatch_with_disk_offload_equals_single_device(tmp_path):
    model = build_lm(CONFIG, seed=1)
    reference = copy.deepcopy(model)
    total = sizes_of(model)[""]
    device_map = accelerate_device_map(model, {"cpu": total // 2, "disk": 4 * total})
    assert "disk" in device_map.values() and "cpu" in device_map.values()
    folder = tmp_path / "offload" / "lm"
    offload = dispatch_with_offload(model, device_map, folder)
    assert offload is not None and not offload.reused
    ids = torch.randint(0, CONFIG.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))
    on_disk = disk_tensors(reference, device_map)
    for name, p in model.named_parameters():
        assert (p.device.type == "meta") == (name in on_disk)
    listing = parameter_listing(model, device_map, offload)
    assert "meta" in listing and "disk: head.weight.dat" in listing
    assert "torch.float32" in listing and "in memory on cpu" in listing
    assert sorted(p.name for p in folder.parent.iterdir()) == ["lm"]  # nothing else left


def test_offload_folder_is_reused_only_when_it_matches(tmp_path):
    tensors = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(3)}
    folder = tmp_path / "off"
    first = write_offload_folder(tensors, folder)
    assert not first.reused and (folder / MANIFEST).is_file() and (folder / "index.json").is_file()
    assert write_offload_folder(tensors, folder).reused
    tensors["b.bias"] = torch.zeros(3)  # stale folder: other weights
    assert not write_offload_folder(tensors, folder).reused
    (folder / "a.weight.dat").write_bytes(b"corrupt")  # damaged file: rewritten, not trusted
    again = write_offload_folder(tensors, folder)
    assert not again.reused and again.tensors == first.tensors | {"b.bias": again.tensors["b.bias"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["off"]
    remove_offload_folder(folder)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_with_other_files_is_never_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FolderError, match=r"notes.txt.*refusing to replace it"):
        write_offload_folder({"w": torch.ones(2)}, tmp_path)
    with pytest.raises(FolderError, match="refusing"):
        remove_offload_folder(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def interrupt_offload_after(monkeypatch, n: int) -> None:
    """Make accelerate's writer stop (as on Ctrl-C) after writing ``n`` tensor files."""
    import accelerate.utils.offload as offload_module

    real, calls = offload_module.offload_weight, []

    def offload_weight(*args, **kwargs):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(offload_module, "offload_weight", offload_weight)


def test_offload_folder_is_never_left_half_written(tmp_path, monkeypatch):
    good = {f"t{i}": torch.full((4,), float(i)) for i in range(4)}
    folder = tmp_path / "off"
    write_offload_folder(good, folder)
    with monkeypatch.context() as patch:
        interrupt_offload_after(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            write_offload_folder({n: t + 1 for n, t in good.items()}, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["off"]  # no temporary left
    assert write_offload_folder(good, folder).reused  # the previous folder is intact
    remove_offload_folder(folder)
    with monkeypatch.context() as patch:
        interrupt_offload_after(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            write_offload_folder(good, folder)
    assert list(tmp_path.iterdir()) == []  # no folder at all, rather than half of one


def test_plot_plans_writes_one_png(tmp_path, lm):
    total = sizes_of(lm)[""]
    budget = {0: int(0.4 * total), "cpu": int(0.3 * total), "disk": "1GiB"}
    plans = {
        "hand": plan_device_map(lm, budget, reserve_largest_layer=False),
        "reserve": plan_device_map(lm, budget),
        "balanced": plan_device_map(lm, {0: total, 1: total}),  # draws max_memory too
    }
    assert plans["balanced"].budgets[0] < plans["balanced"].max_memory[0]
    path = plot_plans(lm, plans, tmp_path / "dm.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["dm.png"]


def test_without_max_memory_auto_keeps_a_tenth_of_one_gpu_free():
    """The source's call gives no max_memory: get_balanced_memory then keeps 10% of a single
    GPU free for "auto"; "sequential" fills all of it (simulated free memory)."""
    from helpers.placement.offload import accelerate_without_max_memory

    model = build_lm(CONFIG, seed=0)
    total = module_sizes(model)[""]
    free = {0: int(0.95 * total), "cpu": 2 * total}
    auto, sequential = (accelerate_without_max_memory(model, free, strategy=s)
                        for s in ("auto", "sequential"))
    assert auto[0][0] == pytest.approx(0.9 * free[0]) and sequential[0][0] == free[0]
    on_gpu = [sum(d == 0 for d in plan.values()) for _, plan in (auto, sequential)]
    assert on_gpu[0] < on_gpu[1]


def test_a_refusal_is_printed_in_lines_that_fit_an_output_area():
    from helpers.runs.placement.report import caught

    text = caught(ValueError("x = 'a' is not a size; valid forms: " + "a form, " * 30))
    lines = text.splitlines()
    assert lines[0] == "caught: x = 'a' is not a size" and lines[1].startswith("  valid forms:")
    assert len(lines) > 2 and all(len(line) <= 100 for line in lines)
    assert caught(ValueError("no choices here")) == "caught: no choices here"


def test_the_offload_verdict_says_slower_only_beyond_the_spread():
    from helpers.core.timing import Timing
    from helpers.runs.placement.report import slower_verdict

    one = Timing("one device", [1.0, 1.1, 0.9])
    assert slower_verdict(Timing("disk", [2.0, 2.1, 1.9]), one).endswith("slower beyond the spread")
    assert "within the spread" in slower_verdict(Timing("disk", [1.0, 1.3, 0.8]), one)
    assert slower_verdict(Timing("disk", [0.5, 0.5, 0.5]), one).endswith("faster beyond the spread")
    assert slower_verdict(Timing("disk", [2.0, 2.1, 1.9]), one).startswith(
        "disk: 2.00x the time of one device")
