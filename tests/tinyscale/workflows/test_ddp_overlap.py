"""DDP's all-reduces in a profiled step (tinyscale.workflows.ddp_overlap): one bucket starts
only after the backward; small buckets start while it runs, as many as DDP's bucket plan."""

import json

import pytest

from helpers import TIMEOUTS
from tinyscale.comm.comm_model import ddp_bucket_plan
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.workflows.ddp_overlap import ddp_profiles, main


def test_ddp_all_reduces_overlap_the_backward_only_with_small_buckets(tmp_path) -> None:
    caps = [25.0, 0.05]
    ranks = run_on_ranks(ddp_profiles, 2, caps, str(tmp_path), **TIMEOUTS)
    params = list(reversed(list(TinyTransformer().named_parameters())))
    for rank in ranks:
        one, small = rank
        assert one["allreduces"] == 1 and one["backward_ops_after_first"] == 0
        assert small["allreduces"] == len(ddp_bucket_plan(params, bucket_cap_mb=0.05)) > 1
        assert small["backward_ops_after_first"] > 0  # launched while backward still runs
    for r in range(2):
        for cap in caps:
            trace = json.loads((tmp_path / f"ddp_bucket{cap:g}MB_rank{r}.json").read_text())
            assert "gloo:all_reduce" in {e.get("name") for e in trace["traceEvents"]}
    same = ("allreduces", "backward_ops_after_first")  # fixed by the graph, not the clock
    assert [[o[k] for k in same] for o in ranks[0]] == [[o[k] for k in same] for o in ranks[1]]


@pytest.mark.parametrize("caps", ["0", "25,big", ""])
def test_bad_bucket_sizes_are_one_line(caps, capsys) -> None:
    assert run_cli(main, ["--bucket-cap-mb", caps]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--bucket-cap-mb" in err, err
