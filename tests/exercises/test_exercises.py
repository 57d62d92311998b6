"""Every exercise: its reference solution passes, a plausible wrong answer gets feedback,
the placeholder is "not solved yet", and the lessons store only unsolved exercises."""

from __future__ import annotations

import importlib
import json
import re
from functools import cache

import pytest
import torch
from torch import nn

from course_tools.run_notebooks import lessons
from helpers.exercises import Feedback, load_solution, show_solution
from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given
from helpers.exercises.solutions import SOLUTIONS_DIR, load_solutions, sections
from helpers.profiles import get_profile
from helpers.torchrun.in_notebook import run_ranks

MODULES = ("collectives", "context_parallel", "data_parallel", "debugging", "expert_parallel",
           "layout_fits",
           "mesh_groups",
           "model_parallel", "pipeline", "placement", "tensor_parallel", "torchrun",
           "transformer_tp", "vocab_loss")
LESSONS = lessons()


def checkers() -> dict[str, object]:
    """Exercise id -> its checker, found in helpers.exercises.<topic>."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(f"helpers.exercises.{name}")
        for value in vars(module).values():
            if callable(value) and hasattr(value, "exercise"):
                assert value.exercise not in found, f"two checkers for {value.exercise}"
                found[value.exercise] = value
    return found


CHECKERS = checkers()


@cache
def resnet_flops() -> list[int]:
    from helpers.model_parallel.resnet import resnet50, resnet_layers
    from helpers.pipeline.stage_cuts import layer_flops

    torch.manual_seed(0)
    return layer_flops(resnet_layers(resnet50(10), blocks=True), torch.randn(1, 3, 64, 64))


def tiny_lm() -> nn.Module:
    from helpers.models.llama import build_lm

    return build_lm(get_profile("small").lm.model, seed=0)


def extra_args(exercise: str) -> tuple:
    """What the lesson's check cell passes besides the answer."""
    if exercise == "02.1":
        return (resnet_flops(),)
    if exercise in ("05.1", "05.2", "05.3"):
        return (tiny_lm(),)
    if exercise == "13.3":
        return (MESH_CALLS, MESH_SENT)
    return ()


# lesson 13's 2 x 2 x 2 rank 0, per step: calls and ring bytes per mesh dimension
MESH_CALLS, MESH_SENT = {"tp": 40.0, "dp": 6.0, "pp": 3.0}, {"tp": 2.9e5, "dp": 3.1e5, "pp": 1.6e4}


def check(exercise: str, value: object, *args: object) -> Feedback:
    return CHECKERS[exercise](value, *(args or extra_args(exercise)))


class _Identity(torch.autograd.Function):
    """A wrong g: no all-reduce."""

    @staticmethod
    def forward(ctx, partial, group):
        return partial.view_as(partial)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Unsolved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, group): ...

    @staticmethod
    def backward(ctx, grad): ...


def _no_reserve(sizes):
    blocks = [n for n in sizes if re.fullmatch(r"blocks\.\d+", n)]
    half = len(blocks) // 2
    return {0: sizes["embed"] + sum(sizes[b] for b in blocks[:half]),
            1: sum(sizes[b] for b in blocks[half:]) + sizes["norm"], "cpu": 2 * sizes["head"]}


def _whole_sum(full, rank, world_size, group):
    """A wrong reduce-scatter: the all-reduced tensor, every chunk of it."""
    out = full.clone()
    torch.distributed.all_reduce(out, group=group)
    return out


def _vocab_loss(local, targets, start, end, group, *, shift=True, max_sum=True, exp_sum=True,
                target_sum=True, target_shift=True, mean=True):
    """Exercise 09.3's loss, each step of which a wrong answer can leave out."""
    all_reduce = torch.distributed.all_reduce
    row_max = local.max(dim=-1).values
    if max_sum:
        all_reduce(row_max, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = local - (row_max if shift else torch.zeros_like(row_max)).unsqueeze(-1)
    sum_exp = shifted.exp().sum(dim=-1)
    if exp_sum:
        all_reduce(sum_exp, group=group)
    inside = (targets >= start) & (targets < end)
    index = torch.where(inside, targets - start, 0).unsqueeze(-1)
    picked = (shifted if target_shift else local).gather(-1, index).squeeze(-1)
    target = torch.where(inside, picked, 0.0)
    if target_sum:
        all_reduce(target, group=group)
    loss = sum_exp.log() - target
    return loss.mean() if mean else loss.sum()


def _loss_without(**left_out):
    return lambda *args: _vocab_loss(*args, **left_out)


NODE0 = ["--nnodes=2", "--nproc-per-node=4", "--node-rank=0", "--master-addr=node0.example",
         "--master-port=29500", "-m", "helpers.tp_demo", "--mode", "tp", "--world_size", "8"]

# Plausible mistakes, and a word the feedback must contain.
WRONG = {
    "01.1": ({("dev0", "activations")}, "copy"),
    "01.2": (lambda layers, cut, batch: layers[:cut](torch.zeros(batch, layers[0].in_features))
             .numel() * 4, "back"),
    "01.3": (lambda f, b: [(x + y) / max(map(sum, zip(f, b, strict=True)))
                           for x, y in zip(f, b, strict=True)], "sum of all"),
    "02.1": (lambda costs: [len(costs) // 3, 2 * len(costs) // 3], "slowest"),
    "02.2": (lambda block, batch, size: batch * 512 * -(-size // 8) ** 2 * 4, "channels"),
    "02.3": (lambda times, copy: sum(times) / max(times), "at once"),
    "03.1": (lambda costs, m: (len(costs) - 1) / (m + len(costs) - 1), "slowest stage"),
    "03.2": (20, "over 10%"),
    "03.3": (lambda k, m: (2 * m, k - 1), "drain"),
    "04.1": (lambda s, k, m, v: (k - 1) / (m + k - 1), "1/v"),
    "04.2": (lambda s, k, m, stage, w, a: w + a * (m if s == "gpipe" else k), "stage k run"),
    "04.3": (lambda k, m, stage: m, "activations"),
    "05.1": (_no_reserve, "largest layer"),
    "05.2": (lambda device_map, sizes: sum(sizes[n] for n, d in device_map.items() if d == "disk"),
             "CPU memory"),
    "05.3": (lambda device_map, sizes: sum(sizes[n] for n, d in device_map.items() if d == 0),
             "beside"),
    "06.1": (lambda params, n: 4 * params + 12 * params // n, "ZeRO-1"),
    "06.2": (lambda stage, s, n: 2 * (n - 1) / n * s, "gathered the weights once"),
    "06.3": (_whole_sum, "whole sum"),
    "07.1": (lambda t, h, f, p, plan: t * h if p > 1 else 0, "partial sum"),
    "07.2": (_Identity, "partial output"),
    "07.3": (lambda t, h, p, layers: layers * 2 * (p - 1) / p * t * h * 4, "backward"),
    "08.1": (NODE0, "second machine"),
    "08.2": (lambda env: (f"cuda:{env['RANK']}", f"fc1_{env['RANK']}.bin",
                          f"fc2_{env['RANK']}.bin"), "LOCAL_RANK"),
    "08.3": (lambda t, h, f, p, rate, bandwidth, latency: float(p), "all-reduce"),
    "09.1": ({"attn_norm.weight", "mlp_norm.weight"}, "attention half"),
    "09.2": (lambda t, h, tp, e: t * (6 * h * e + 8) * (tp - 1) / tp, "Korthikanti"),
    "09.3": (_loss_without(shift=False), "maximum"),
    "13.1": (lambda pp, dp, tp: {"pp": [list(range(k, pp * dp * tp, dp * tp)) for k in range(dp * tp)],
                                 "dp": [[p * dp * tp + d * tp + t for d in range(dp)]
                                        for p in range(pp) for t in range(tp)],
                                 "tp": [[t * pp * dp + q for t in range(tp)]
                                        for q in range(pp * dp)]}, "row-major"),
    "13.2": (("activations", "pp"), "first stage"),
    "10.1": (lambda out_a, lse_a, out_b, lse_b: (out_a + out_b) / 2, "share"),
    "10.2": ((44 * 2 * 2**20, 44 * 2 * 2**20), "Ulysses"),
    "10.3": (lambda cp: [r + 1 for r in range(cp)], "chunks r and 2cp-1-r"),
    "11.1": (lambda counts, rank, hidden, element_bytes:
             int(counts[rank].sum()) * hidden * element_bytes, "stay home"),
    "11.2": (lambda expert_choices, num_experts, capacity:
             torch.zeros(expert_choices.shape, dtype=torch.bool), "(capacity"),
    "11.3": ("a", "nothing is missed"),
    "12.1": (lambda computing, communicating:
             sum(max(0, min(ce, me) - max(cs, ms)) for cs, ce in computing
                 for ms, me in communicating) / sum(me - ms for ms, me in communicating),
             "as a union"),
    "12.2": (lambda tps, n, layers, d, s, peak: (6 * n + 12 * layers * s * d) * tps / peak,
             "sparse figure"),
    "12.3": (0, "agrees with the majority"),
    "13.3": (("dp", 43), "calls most often"),
}
PLACEHOLDERS = {"01.1": ..., "07.2": _Unsolved, "03.2": ..., "08.1": ...,
                "09.1": ..., "10.2": ..., "11.3": ..., "12.3": ..., "13.2": ..., "13.3": ...}
# Lessons with fewer than two exercises, and why (none at present).
ONE_EXERCISE: set[str] = set()


def test_every_exercise_has_a_checker_a_wrong_answer_and_a_solution():
    solutions = {k for p in SOLUTIONS_DIR.glob("[0-9][0-9]_*.py")
                 for k in load_solutions(p.name[:2]).ANSWERS}
    assert set(CHECKERS) == set(WRONG) == solutions


@pytest.mark.parametrize("exercise", sorted(WRONG))
def test_the_reference_solution_is_right(exercise):
    feedback = check(exercise, load_solution(exercise))
    assert feedback.status == "right", feedback
    assert repr(feedback).startswith(f"✓ Exercise {exercise}: right!")


@pytest.mark.parametrize("exercise", sorted(WRONG))
def test_a_plausible_wrong_answer_is_told_what_is_wrong(exercise):
    wrong, word = WRONG[exercise]
    feedback = check(exercise, wrong)
    assert feedback.status == "wrong", feedback
    assert word in f"{feedback.message} {feedback.hint}", feedback
    assert repr(feedback).startswith(f"✗ Exercise {exercise}: not right yet.")


@pytest.mark.parametrize("exercise", sorted(WRONG))
def test_the_placeholder_is_not_solved_yet(exercise):
    placeholder = PLACEHOLDERS.get(exercise, lambda *args: None)
    feedback = check(exercise, placeholder)
    assert feedback.status == "unsolved" and not feedback.solved
    assert repr(feedback).startswith(f"… Exercise {exercise}: not solved yet.")


def test_a_check_keeps_the_callers_random_state():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check("01.1", load_solution("01.1"))
    assert torch.equal(torch.get_rng_state(), before)


def test_an_answer_that_raises_is_reported_with_the_call():
    feedback = check("03.1", lambda costs, m: 1 / 0)
    assert feedback.status == "wrong"
    assert "<lambda>([1, 1], 4)" in feedback.message  # the call, with its arguments
    assert "raised ZeroDivisionError" in feedback.message


def test_a_value_where_a_function_belongs_is_reported():
    assert "Expected a function" in check("01.2", 42).message


def test_bad_shapes_of_answers_are_reported():
    assert "expected a whole number" in check("03.2", 2.5).message
    assert "Expected a list of strings" in check("08.1", "--nnodes=2").message
    assert "torchrun refuses" in check("08.1", ["--nnodes=2", "--bogus"]).message
    assert "starts with 'torchrun'" in check("08.1", ["torchrun", *NODE0]).message
    assert "two indices" in check("02.1", lambda costs: 3).message
    assert "invalid max_memory" in check("05.1", lambda sizes: {"gpu": 1}).message


def test_feedback_refuses_an_unknown_status():
    with pytest.raises(ValueError, match="valid: unsolved, wrong, right"):
        Feedback("01.1", "maybe", "?")


def test_the_checker_decorator_turns_outcomes_into_feedback():
    @checker("99.1", "write it")
    def demo(value):
        if given(value) == 0:
            raise Wrong("zero", "try one")
        return "fine"

    assert demo(...).status == "unsolved"
    assert repr(demo(0)) == "✗ Exercise 99.1: not right yet. zero\n  Hint: try one"
    assert demo(1).solved
    with pytest.raises(NotSolved):
        answer(lambda: None)


def test_show_solution_prints_one_section_and_refuses_bad_ids():
    text = repr(show_solution("07.2"))
    assert text.startswith("# %% Exercise 07.2") and "class AllReduceSum" in text
    assert "07.3" not in text and "ANSWERS" not in text
    with pytest.raises(ValueError, match="valid: 'NN.k'"):
        show_solution("6.2")
    with pytest.raises(ValueError, match="has no exercise '07.9'"):
        show_solution("07.9")
    with pytest.raises(ValueError, match="no single solutions file for lesson 42"):
        show_solution("42.1")


def test_every_solutions_section_has_an_answer():
    for path in SOLUTIONS_DIR.glob("[0-9][0-9]_*.py"):
        assert set(sections(path)) == set(load_solutions(path.name[:2]).ANSWERS), path.name


def test_two_ranks_really_communicate():
    def work(rank, group):
        t = torch.tensor([float(rank + 1)])
        torch.distributed.all_reduce(t, group=group)
        return t.item()

    assert run_ranks(3, work, timeout=20) == [6.0, 6.0, 6.0]


def test_a_collective_one_rank_skips_is_reported_not_hung():
    def work(rank, group):
        if rank == 0:
            torch.distributed.all_reduce(torch.ones(1), group=group)
        return rank

    results = run_ranks(2, work, timeout=2)
    assert isinstance(results[0], BaseException) and results[1] == 1


def exercise_cells(notebook):
    """(exercise id, its check cell) of a stored lesson."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found, current = [], None
    for cell in cells:
        text = "".join(cell["source"])
        heading = re.match(r"### Exercise (\d\d\.\d+): ", text)
        if cell["cell_type"] == "markdown" and heading:
            current = heading.group(1)
        elif cell["cell_type"] == "code" and current and re.search(r"^check_\w+\(", text, re.M):
            found.append((current, cell))
            current = None
    return found


@pytest.mark.parametrize("notebook", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_ends_with_unsolved_exercises_and_further_reading(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    found = exercise_cells(notebook)
    assert (1 if notebook.name[:2] in ONE_EXERCISE else 2) <= len(found) <= 3
    lesson = notebook.name[:2]
    for exercise, cell in found:
        assert exercise.startswith(lesson)
        call = re.search(r"^(check_\w+)\(", "".join(cell["source"]), re.M).group(1)
        assert CHECKERS[exercise].__name__ == call
        shown = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in cell["outputs"])
        assert shown.startswith(f"… Exercise {exercise}: not solved yet."), shown
    reading = [m for m in markdown if m.startswith("## Further reading")]
    assert len(reading) == 1 and len(re.findall(r"\]\(https://", reading[0])) >= 4
    assert markdown.index(reading[0]) > max(i for i, m in enumerate(markdown) if "## Exercises" in m)


# Lesson 06: ZeRO's bytes held and sent, a reduce-scatter built by hand.

def _chunk_of_all_reduce(full, group, world_size, pick):
    out = full.clone()
    torch.distributed.all_reduce(out, group=group)
    return pick(out.chunk(world_size))


def _next_chunk(full, rank, world_size, group):
    return _chunk_of_all_reduce(full, group, world_size, lambda c: c[(rank + 1) % world_size])


def _mean_chunk(full, rank, world_size, group):
    return _chunk_of_all_reduce(full, group, world_size, lambda c: c[rank] / world_size)


def _in_place(full, rank, world_size, group):
    torch.distributed.all_reduce(full, group=group)
    return full.chunk(world_size)[rank]


def _all_send_first(full, rank, world_size, group):
    chunks, buf = full.clone().chunk(world_size), torch.empty(full.numel() // world_size)
    torch.distributed.send(chunks[rank - 1].contiguous(), (rank + 1) % world_size, group=group)
    torch.distributed.recv(buf, (rank - 1) % world_size, group=group)
    return chunks[rank] + buf


def _library(full, rank, world_size, group):
    out = torch.empty(full.numel() // world_size)
    torch.distributed.reduce_scatter_single(out, full.clone(), group=group)
    return out


def _default_group(full, rank, world_size, group):
    out = full.clone()
    torch.distributed.all_reduce(out)
    return out.chunk(world_size)[rank]


@pytest.mark.parametrize("wrong, words", [
    (lambda p, n: 4 * p + 12 * p / n, "ZeRO-1"),
    (lambda p, n: 16 * p // n, "ZeRO-3"),
    (lambda p, n: 16 * p, "DDP"),
    (lambda p, n: 2 * p + 14 * p * (n - 1) / n, "(N-1)/N"),
    (lambda p, n: 4 * p + 16 * p / n, "16-bit"),
    (lambda p, n: 2 * p + 10 * p / n, "master copy"),
    (lambda p, n: 3 * p, "split over the N ranks"),
    (lambda p, n: "many", "expected a number"),
])
def test_zero2_mistakes_get_their_hints(wrong, words):
    feedback = check("06.1", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_zero2_accepts_floats_within_a_byte():
    assert check("06.1", lambda p, n: 2 * p + 14 * p / n + 0.5).solved


def test_zero_bytes_follow_the_papers_table():
    from helpers.exercises.data_parallel import zero_bytes

    p, n = 7_000, 7
    assert [zero_bytes(p, n, k) for k in range(4)] == pytest.approx(
        [16 * p, (4 + 12 / n) * p, (2 + 14 / n) * p, 16 * p / n])


def test_the_small_model_count_is_the_built_models():
    from helpers.exercises.data_parallel import small_lm_params

    assert small_lm_params() == sum(t.numel() for t in tiny_lm().parameters())


@pytest.mark.parametrize("wrong, words", [
    (lambda k, s, n: {0: 2, 1: 2, 2: 2, 3: 4}[k] * (n - 1) / n * s, "as gloo runs it"),
    (lambda k, s, n: {0: 2, 1: 1, 2: 1, 3: 3}[k] * (n - 1) / n * s, "only its own slice"),
    (lambda k, s, n: {0: 2, 1: 3, 2: 3, 3: 3}[k] * (n - 1) / n * s, "once, no more"),
    (lambda k, s, n: {0: 1, 1: 2, 2: 2, 3: 3}[k] * (n - 1) / n * s, "two ring passes"),
    (lambda k, s, n: {0: 2, 1: 2, 2: 2, 3: 3}[k] * s, "never sends the chunk"),
    (lambda k, s, n: {0: 2, 1: 2, 2: 2, 3: 3}[k] * s / 2, "list the collectives"),
])
def test_zero_ring_bytes_mistakes_get_their_hints(wrong, words):
    feedback = check("06.2", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_zero_ring_bytes_follow_the_plans_the_launch_is_checked_against():
    from helpers.exercises import data_parallel as dp

    s, n = 4 * dp.small_lm_params(), 4
    ratios = [dp.step_ring_bytes(k, s, n) / dp.step_ring_bytes(0, s, n) for k in dp.STAGES]
    assert ratios == [1, 1, 1, 1.5] and dp.step_ring_bytes(3, s, 1) == 0
    assert "ZeRO-3 1.5" in check("06.2", load_solution("06.2")).message


@pytest.mark.parametrize("wrong, words", [
    (_whole_sum, "whole sum"),
    (_next_chunk, "returned chunk 1"),
    (_mean_chunk, "mean"),
    (_in_place, "input tensor was changed"),
    (_all_send_first, "dist.isend"),
    (_library, "library's own"),
    (_default_group, "no default group"),
])
def test_reduce_scatter_mistakes_get_their_hints(wrong, words, monkeypatch):
    from helpers.exercises import collectives

    monkeypatch.setattr(collectives, "RS_TIMEOUT", 2.0)  # the deadlock waits this long
    feedback = check("06.3", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_the_reduce_scatter_check_is_quick_and_leaves_torch_as_it_was():
    import time

    from torch.distributed.distributed_c10d import _world

    from helpers.exercises.collectives import RS_CASES

    assert [n for n, _ in RS_CASES] == [2, 4]
    library, groups = torch.distributed.reduce_scatter_single, dict(_world.pg_group_ranks)
    start = time.perf_counter()
    assert check("06.3", load_solution("06.3")).solved
    assert time.perf_counter() - start < 10
    assert torch.distributed.reduce_scatter_single is library
    assert dict(_world.pg_group_ranks) == groups


# Lesson 09: why each block needs f, what sequence parallelism saves, the vocab-parallel loss.

NINE = ("attn_norm.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
        "attn.o_proj.weight", "mlp_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight")


@pytest.mark.parametrize("wrong, words", [
    (set(NINE), "g, whose backward is the identity"),
    ({"mlp.up_proj.weight"}, "g, whose backward is the identity"),
    (set(), "mlp_norm's"),
    ({"attn_norm.weight", "mlp_norm.weight", "attn.q_proj.weight"}, "attention half"),
    ({"attn.o_proj"}, "not a weight of the block"),
    ("attn_norm.weight", "Expected a set"),
])
def test_f_mistakes_get_their_hints(wrong, words):
    feedback = check("09.1", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_the_f_answer_is_what_a_run_without_f_gets_wrong():
    from helpers.exercises.transformer_tp import BLOCK_WEIGHTS, wrong_without_f_answer

    assert BLOCK_WEIGHTS == NINE
    assert wrong_without_f_answer() == set(NINE[:6])  # the norms and attention; the MLP right
    assert check("09.1", list(NINE[:6])).solved
    assert check("09.1", ...).status == "unsolved"


def _sp(kept, stats=8, share=lambda tp: (tp - 1) / tp, e_of=lambda e: e):
    return lambda t, h, tp, e: t * (kept * h * e_of(e) + stats) * share(tp)


@pytest.mark.parametrize("wrong, words", [
    (_sp(6), "Korthikanti"),
    (_sp(6, stats=0), "norm outputs are all-gathered"),
    (_sp(4, stats=0), "one float32 rstd per token"),
    (lambda t, h, tp, e: t * (4 * h + 2) * e * (tp - 1) / tp, "whatever element_size"),
    (_sp(4, stats=4), "two norms"),
    (_sp(4, share=lambda tp: 1 / tp), "still keeps"),
    (_sp(4, share=lambda tp: 1), "not all"),
    (_sp(4, share=lambda tp: tp - 1), "all tp ranks"),
    (_sp(4, stats=2, e_of=lambda e: 1), "count bytes"),
    (_sp(2), "four width-h tensors"),
    (lambda t, h, tp, e: "many", "expected a number"),
])
def test_sp_saving_mistakes_get_their_hints(wrong, words):
    feedback = check("09.2", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_the_sp_saving_is_the_estimators_and_ignores_heads_and_mlp_width():
    from helpers.exercises.transformer_tp import SP_CASES, sp_saving_bytes
    from helpers.memory import TransformerShape

    for t, h, tp, e in SP_CASES:
        savings = {sp_saving_bytes(t, h, tp, e, TransformerShape(h, 1, heads, ffn, 64, kv))
                   for heads in (tp, 2 * tp) for kv in (None, 1) for ffn in (3 * tp, 4 * h)}
        assert savings == {t * (4 * h * e + 8) * (tp - 1) // tp}
    assert check("09.2", lambda t, h, tp, e: t * (4 * h * e + 8) * (tp - 1) // tp).solved


def _gathered(local, targets, start, end, group):
    parts = [torch.empty_like(local) for _ in range(group.size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=group)
    return torch.nn.functional.cross_entropy(torch.cat(parts, dim=1), targets)


def _summed_full(local, targets, start, end, group):
    """A gather in disguise: the logits padded with zeros to the whole vocabulary, summed."""
    full = torch.zeros(len(local), (end - start) * group.size())
    full[:, start:end] = local
    torch.distributed.all_reduce(full, group=group)
    return torch.nn.functional.cross_entropy(full, targets)


def _unmasked(local, targets, start, end, group):
    return local[torch.arange(len(targets)), targets - start].mean()


def _only_with_targets(local, targets, start, end, group):
    if ((targets >= start) & (targets < end)).sum() > 1:
        return _vocab_loss(local, targets, start, end, group)
    return local.sum()


def _no_group(local, targets, start, end, group):
    row_max = local.max(dim=-1).values
    torch.distributed.all_reduce(row_max, op=torch.distributed.ReduceOp.MAX)
    return row_max.mean()


@pytest.mark.parametrize("wrong, words", [
    (_loss_without(shift=False), "small logits hide this"),
    (_loss_without(max_sum=False), "same number"),
    (_loss_without(exp_sum=False), "softmax's denominator"),
    (_loss_without(target_sum=False), "contribute nothing"),
    (_loss_without(target_shift=False), "from the same shift"),
    (_loss_without(mean=False), "reduction='mean'"),
    (lambda *args: _vocab_loss(*args) * torch.ones(8), "one loss per token"),
    (lambda *args: _vocab_loss(*args).item(), "expected a tensor"),
    (_gathered, "calls dist.all_gather"),
    (_summed_full, "all-reduced 80 numbers"),
    (_unmasked, "only targets in [start, end)"),
    (_only_with_targets, "same all-reduces in the same order"),
    (_no_group, "no default group"),
])
def test_vocab_loss_mistakes_get_their_hints(wrong, words, monkeypatch):
    from helpers.exercises import vocab_loss

    monkeypatch.setattr(vocab_loss, "LOSS_TIMEOUT", 2.0)  # the skipped all-reduce waits this long
    feedback = check("09.3", wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_the_vocab_loss_check_uses_large_logits_and_leaves_torch_as_it_was():
    import time

    from torch.distributed.distributed_c10d import _world

    from helpers.exercises.vocab_loss import LOSS_CASES, PER_RANK, loss_inputs

    assert [n for n, _ in LOSS_CASES] == [2, 4]
    for world_size, scale in LOSS_CASES:
        logits, targets = loss_inputs(world_size, scale)
        assert set((targets // PER_RANK).tolist()) == set(range(world_size))
        assert targets.max() == world_size * PER_RANK - 1  # the last column is a target
    assert loss_inputs(*LOSS_CASES[-1])[0].max(dim=1).values.min() > 88.8  # exp overflows
    library, groups = torch.distributed.all_reduce, dict(_world.pg_group_ranks)
    start = time.perf_counter()
    assert check("09.3", load_solution("09.3")).solved
    assert time.perf_counter() - start < 10
    assert torch.distributed.all_reduce is library
    assert dict(_world.pg_group_ranks) == groups


# Lesson 13: what fills the card and which cut divides it; why tp is innermost.

def test_the_cut_answer_is_the_estimators_and_every_other_pair_is_told_why():
    from helpers.exercises.layout_fits import CUTS, KINDS

    assert load_solution("13.2") == ("activations", "tp")
    for kind in KINDS:
        for cut in CUTS:
            feedback = check("13.2", (kind, cut))
            assert feedback.solved == ((kind, cut) == ("activations", "tp")), feedback
            if not feedback.solved:  # each wrong kind, each wrong cut: why, in words
                assert ("ZeRO" in feedback.hint if kind != "activations"
                        else "micro-batch" in feedback.hint), feedback


@pytest.mark.parametrize("value, words", [
    (("activation", "tp"), "valid: 'weights'"),
    (("activations", "cp"), "valid: 'dp', 'tp', 'pp'"),
    (["activations", "tp"], "expected a pair of strings"),
])
def test_bad_shapes_of_cut_answers_are_reported(value, words):
    assert words in check("13.2", value).message


def test_the_innermost_answer_follows_the_counted_calls_not_the_bytes():
    assert check("13.3", ("tp", 9)).solved and not check("13.3", ("tp", 9.5)).solved
    assert "dp sends the most bytes" in check("13.3", ("dp", 43)).message
    fewer = {"tp": 2.0, "dp": 6.0, "pp": 3.0}  # were tp to call least, it would not win
    assert check("13.3", ("dp", 5), fewer, MESH_SENT).solved
    assert "expected a pair" in check("13.3", ("cp", 1)).message
