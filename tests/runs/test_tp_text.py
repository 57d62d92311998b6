"""What lessons 07 to 09 print fits an output area, and says "=" where a count is what gloo
predicts; lesson 08's verdicts and charts are read from the timings, never typed."""

from pathlib import Path

import pytest

from helpers.core.checks import Proof
from helpers.core.text import WIDTH, json_text, shell_command, wrapped
from helpers.core.timing import Timing
from helpers.memory.ledger import Ledger
from helpers.runs.tp_ffn.results import NativeRun, TPRun
from helpers.runs.tp_ffn.timings import Sweep
from helpers.runs.tp_ffn.wire import WireCheck, wire_line

COMMAND = ("torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:"
           "50893 --rdzv-id=mesh_worker -m helpers.runs.tp_ffn.mesh_worker --hidden-size 128 "
           "--ffn-size 512 --seq-len 64 --batch-size 2 --device cpu --dtype float32 --seed 1")


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_a_command_is_broken_before_a_flag_and_keeps_every_word():
    text = shell_command(COMMAND, prompt="node 0$ ")
    lines = _lines(text)
    assert len(lines) > 1 and all(len(line) <= WIDTH for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1])
    assert all(line.startswith("    -") for line in lines[1:])  # each goes on with a flag
    words = text.replace(" \\\n", " ").removeprefix("node 0$ ").split()
    assert words == COMMAND.split()
    assert "--hidden-size 128" in text  # a flag stays with its value


def test_wrapped_text_breaks_at_clauses_first_and_never_inside_a_word():
    error = ("tp=3 must divide heads=8 and kv_heads=4 (key/value heads are not replicated "
             "here); valid tp: 1, 2, 4")
    assert _lines(wrapped(f"refused: {error}")) == [
        "refused: tp=3 must divide heads=8 and kv_heads=4 (key/value heads are not replicated "
        "here);", "  valid tp: 1, 2, 4"]
    path = "results/" + "x" * 120 + ".bin"
    assert path in wrapped(f"ShardError: {path} is missing").split()
    assert wrapped("short; line") == "short; line"


def test_json_text_keeps_a_dict_on_one_line_where_it_fits():
    value = {"world_size": 4, "files": {"fc1_1.bin": {"shape": [128, 128], "sha256": "a" * 64,
                                                      "tensor": "fc1.weight", "bytes": 65536}}}
    text = json_text(value, width=90)  # a leaf (the sha256) is never broken
    assert all(len(line) <= 90 for line in _lines(text))
    assert '"shape": [128, 128]' in text and text.count("\n") > 3
    assert json_text({"a": 1}) == '{"a": 1}'


def test_the_wire_column_says_equal_only_where_every_rank_sent_payload_plus_headers():
    exact = (WireCheck(0, 1048, 1000.0, 48), WireCheck(1, 1048, 1000.0, 48))
    assert wire_line(exact) == "= payload + headers ✓"
    within = (WireCheck(0, 1010, 1000.0, 48), WireCheck(1, 1010, 1000.0, 48))
    assert wire_line(within) == "1,010 B"
    assert "not measured (nccl" in wire_line((WireCheck(0, None, 1000.0, 48, "nccl: ..."),))


def _run(p: int, step: list[float], wire: tuple[WireCheck, ...] = ()) -> TPRun:
    return TPRun(p, "gloo", "cpu", "float32", (2, 3), 5.0, 9.0, Proof("output", 0.0, 1e-7),
                 Timing("compute", [s / 4 for s in step]), Timing("all-reduce", step),
                 Timing("step", step), 123.0, Ledger(), wire)  # fmt: skip


def _sweep() -> Sweep:
    native = NativeRun("float32", (2, 3), 5.0, 9.0, Timing("native", [1.0, 1.0]),
                       Proof("tp_simulate", 0.0, 1e-7))  # fmt: skip
    runs = {1: _run(1, [0.5, 0.5]), 2: _run(2, [3.0, 3.0]), 4: _run(4, [0.9, 1.3])}
    return Sweep(native, runs, {p: Timing("sim", [1.0, 1.0]) for p in runs})


def test_the_verdicts_are_the_timings_ratios_and_noise_is_called_so():
    sweep = _sweep()
    assert sweep.verdicts() == [
        "p=1: 0.50x native's time: faster than native",
        "p=2: 3.00x native's time: slower than native",
        "p=4: 1.10x native's time: slower than native; the gap is within the two std (noise)"]
    assert all(len(line) <= WIDTH - 2 for line in sweep.verdicts())  # printed indented
    assert sweep.slower() == [2, 4]


def test_the_timing_tables_fit_and_mark_more_ranks_than_cores():
    sweep = _sweep()
    table = sweep.table(cores=2, device="cpu")
    assert all(len(line) <= WIDTH for line in _lines(table))
    assert _lines(table)[3].endswith(" *") and "oversubscribed" in _lines(table)[-1]
    assert "*" not in sweep.table(cores=8, device="cpu")


def test_the_bytes_row_prints_the_wire_as_equal_or_judged():
    exact = _run(2, [1.0], (WireCheck(0, 1048, 1000.0, 48), WireCheck(1, 1048, 1000.0, 48)))
    assert exact.bytes_row().endswith("= payload + headers ✓")
    over = _run(2, [1.0], (WireCheck(0, 1100, 1000.0, 48),))
    assert over.bytes_row().endswith("1,100 B: NOT within the prediction")
    assert all(len(r.bytes_row()) <= WIDTH for r in (exact, over))


@pytest.mark.parametrize("chart", ["timings", "breakdown"])
def test_lesson_08s_charts_fit_the_output_area(chart, tmp_path: Path):
    import struct

    from helpers.runs.tp_ffn.charts import breakdown_chart, timings_chart

    sweep = _sweep()
    path = (timings_chart(sweep, tmp_path / "t.png", title="t", xlabel="world size")
            if chart == "timings" else breakdown_chart(sweep.runs, tmp_path / "b.png", title="b"))
    width, _ = struct.unpack(">II", path.read_bytes()[16:24])
    assert width <= 950


def test_the_sweeps_verdicts_read_every_world_sizes_proofs_as_one_line():
    from dataclasses import replace

    from helpers.runs.tp_ffn.results import MeshRun, SweepRun

    sweep = _sweep()
    run = SweepRun(sweep.native, sweep.runs)
    verdict = run.output_verdict()  # tp_simulate, then each p's output and sum
    assert verdict.ok and len(verdict.proofs) == 1 + 2 * len(run.runs)
    assert [p.what for p in verdict.proofs[1:3]] == ["p=1 output", "p=1 sum"]
    off = SweepRun(sweep.native, {**sweep.runs, 2: replace(sweep.runs[2], checksum=6.0)})
    assert not off.output_verdict().ok and off.output_verdict().failed[0].what == "p=2 sum"
    with pytest.raises(ValueError, match="took no training step"):
        run.step_verdict()
    with pytest.raises(ValueError, match="timed no wide FFN"):
        run.wide_verdict()
    mesh = MeshRun(4, 2, 2, "gloo", ((0, 1), (2, 3)), (Proof("outputs", 1e-3, 1e-6),))
    assert mesh.verdict().line().startswith("✗ the 2 x 2 mesh's step = one device's")
    assert all(len(v.line()) <= WIDTH for v in (verdict, mesh.verdict()))
