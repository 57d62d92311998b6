"""Ranks as threads: a mesh's groups, each dimension's lines of ranks; errors raised."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers.torchrun.in_notebook import run_mesh, run_ranks


def test_each_dimension_groups_the_ranks_along_it_last_innermost():
    def work(rank, groups):
        seen = {}
        for name, group in groups.items():
            t = torch.tensor([1 << rank])  # a bit per rank: the sum names the members
            dist.all_reduce(t, group=group)
            seen[name] = (group.rank(), group.size(), int(t))
        return seen

    results = run_mesh({"dp": 2, "cp": 2, "tp": 2}, work)
    members = {name: [r[name][2] for r in results] for name in ("dp", "cp", "tp")}
    assert members["tp"] == [0b11, 0b11, 0b1100, 0b1100, 0b110000, 0b110000, 0b11000000,
                             0b11000000]
    assert members["cp"][:4] == [0b101, 0b1010, 0b101, 0b1010]
    assert members["dp"][0] == 0b10001 and results[5]["dp"][:2] == (1, 2)


def test_a_bad_dimension_is_refused_by_name():
    with pytest.raises(ValueError, match="cp=0; valid: an integer >= 1"):
        run_mesh({"cp": 0, "tp": 2}, lambda rank, groups: None)


def test_raise_errors_raises_the_first_failed_ranks_error_instead_of_returning_it():
    def work(rank, group):
        if rank:
            raise ValueError(f"rank {rank} failed")
        return rank

    returned = run_ranks(3, work, timeout=10)
    assert returned[0] == 0 and [str(e) for e in returned[1:]] == ["rank 1 failed",
                                                                    "rank 2 failed"]
    with pytest.raises(ValueError, match="^rank 1 failed$"):
        run_ranks(3, work, timeout=10, raise_errors=True)
    assert run_ranks(2, lambda rank, group: rank, raise_errors=True) == [0, 1]
    with pytest.raises(ValueError, match="^rank 1 failed$"):  # the mesh's ranks, the same way
        run_mesh({"cp": 1, "tp": 3}, lambda rank, groups: work(rank, None), raise_errors=True)
