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

from helpers.core.paths import REPO_ROOT
from helpers.core.profiles import get_profile
from helpers.exercises import Feedback, load_solution, show_solution
from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given
from helpers.exercises.solutions import SOLUTIONS_DIR, load_solutions, sections
from helpers.exercises.two_ranks import run_ranks

MODULES = ("collectives", "data_parallel", "model_parallel", "pipeline", "placement", "tensor_parallel",
           "torchrun")
LESSONS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


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
    from helpers.placement.tiny_lm import build_lm, lm_config_for

    return build_lm(lm_config_for(get_profile("small")), seed=0)


def extra_args(exercise: str) -> tuple:
    """What the lesson's check cell passes besides the answer."""
    if exercise == "02.1":
        return (resnet_flops(),)
    if exercise in ("05.1", "05.2"):
        return (tiny_lm(),)
    return ()


def check(exercise: str, value: object) -> Feedback:
    return CHECKERS[exercise](value, *extra_args(exercise))


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


NODE0 = ["--nnodes=2", "--nproc-per-node=4", "--node-rank=0", "--master-addr=node0.example",
         "--master-port=29500", "-m", "helpers.tp_demo", "--mode", "tp", "--world_size", "8"]

# Plausible mistakes, and a word the feedback must contain.
WRONG = {
    "01.1": (lambda m: sum(8 * p.numel() for p in m.parameters()), "counter"),
    "01.2": (lambda layers, cut, batch: layers[:cut](torch.zeros(batch, layers[0].in_features))
             .numel() * 4, "back"),
    "02.1": (lambda costs: [len(costs) // 3, 2 * len(costs) // 3], "slowest"),
    "02.2": (lambda block, batch, size: batch * 512 * -(-size // 8) ** 2 * 4, "channels"),
    "03.1": (lambda costs, m: (len(costs) - 1) / (m + len(costs) - 1), "slowest stage"),
    "03.2": (20, "over 10%"),
    "04.1": (lambda s, k, m, v: (k - 1) / (m + k - 1), "1/v"),
    "04.2": (lambda s, k, m, stage, w, a: w + a * (m if s == "gpipe" else k), "stage k run"),
    "05.1": (_no_reserve, "largest layer"),
    "05.2": (lambda device_map, sizes: sum(sizes[n] for n, d in device_map.items() if d == "disk"),
             "CPU memory"),
    "06.1": (lambda params, n: 4 * params + 12 * params // n, "ZeRO-1"),
    "06.2": (0, "would need"),
    "06.3": (_whole_sum, "whole sum"),
    "07.1": (lambda fc1, fc2, rank, p: (fc1[:, rank * 2:(rank + 1) * 2], fc2), "shape"),
    "07.2": (_Identity, "partial output"),
    "07.3": (lambda t, h, p, layers: layers * 2 * (p - 1) / p * t * h * 4, "backward"),
    "08.1": (NODE0, "second machine"),
    "08.2": (8, "fewer stages"),
}
PLACEHOLDERS = {"07.2": _Unsolved, "03.2": ..., "06.2": ..., "08.1": ..., "08.2": ...}


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
    assert "Expected a function" in check("01.1", 42).message


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
    assert 2 <= len(found) <= 3
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


# Lesson 06: ZeRO's bytes, the smallest stage for Llama-7B, a reduce-scatter built by hand.

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


def test_the_stage_for_llama_7b_comes_from_the_estimator():
    from helpers.exercises import data_parallel as dp

    totals = [dp.zero_stage_total(k) for k in dp.STAGES]
    assert totals == sorted(totals, reverse=True)  # each stage shards more
    want = next(k for k, t in zip(dp.STAGES, totals, strict=True) if t <= dp.CARD)
    assert load_solution("06.2") == want == dp.smallest_fitting_stage()
    for stage in dp.STAGES:
        feedback = check("06.2", stage)
        assert feedback.solved == (stage == want), feedback
        text = f"{feedback.message} {feedback.hint}"
        assert "ZeRO-0 (DDP): " in text and "ZeRO-3: " in text
        assert ("would need" in text) == (stage < want)
    for value in (4, 2.0, True, "3"):
        assert "expected a stage" in check("06.2", value).message


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
