"""Profiling the course model's step: the parts sum to the total, the attention kernel and
dropout's ops read from the profile, AdamW's kernels give the same training, DDP's
all-reduces in the trace, and py-spy on a rank blocked in a collective."""

import json
import subprocess
import threading
import time

import pytest
import torch

from helpers import TIMEOUTS, one_line_error
from tinyscale.comm.comm_model import ddp_bucket_plan
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.workflows.profiling import (
    GROUPS,
    ProfileConfig,
    attention_kernel,
    blocked_rank,
    build,
    ddp_profiles,
    grouped_times,
    main,
    profile_steps,
    train_step,
)

TINY = {"batch_size": 2, "warmup": 1, "steps": 1}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[float, tuple]:
    out = tmp_path_factory.mktemp("profiling")
    return {p: profile_steps(ProfileConfig(dropout=p, trace_dir=out, **TINY), name=f"d{p}")
            for p in (0.0, 0.1)}  # fmt: skip


def test_the_parts_sum_to_the_tables_total(profiles) -> None:
    prof, _, _ = profiles[0.1]
    times = grouped_times(prof)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    assert sum(times.values()) == pytest.approx(total, rel=1e-9)
    assert all(times[part] > 0 for part in GROUPS), times
    # p = 0: nn.Dropout still calls aten::dropout, which returns its input and runs no op
    dropouts = [e for e in profiles[0.0][0].events() if e.name == "aten::dropout"]
    assert dropouts and not any(e.cpu_children for e in dropouts)


def test_dropout_sends_attention_to_the_math_path(profiles) -> None:
    """With dropout_p > 0 the CPU's fused (flash) kernel is not used: the unfused math path."""
    assert attention_kernel(profiles[0.0][0]) == "fused (flash, CPU)"
    assert attention_kernel(profiles[0.1][0]) == "math (unfused)"
    calls = {e.key: e.count for e in profiles[0.1][0].key_averages()}
    layers = TinyTransformer().cfg.num_hidden_layers
    # one mask after the embeddings, three per block: attention weights, attention, MLP
    assert calls["aten::bernoulli_"] == 1 + 3 * layers
    assert "aten::bernoulli_" not in {e.key for e in profiles[0.0][0].key_averages()}


def test_the_trace_holds_the_parts_ranges(profiles) -> None:
    _, _, trace = profiles[0.1]
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"attention", "mlp", "embeddings/head", "optimizer", "train_step"} <= names
    assert not list(trace.parent.glob("*.tmp"))


# for-loop, foreach and fused AdamW train alike: the weights after ADAMW_STEPS steps agree
# within ADAMW_ATOL (docs/workflows/profiling.md states both; tests/docs/test_prose_profiling.py
# compares them)
ADAMW_STEPS = 3
ADAMW_ATOL = 3e-5


def test_adamw_kernels_train_alike() -> None:
    """for-loop, foreach and fused AdamW: the same losses and weights, to float rounding."""
    runs = {}
    for adamw in ("for-loop", "foreach", "fused"):
        model, opt, batch = build(ProfileConfig(dropout=0.0, adamw=adamw, batch_size=2))
        losses = [train_step(model, opt, batch) for _ in range(ADAMW_STEPS)]
        runs[adamw] = (losses, torch.cat([p.detach().flatten() for p in model.parameters()]))
    for adamw in ("foreach", "fused"):
        assert runs[adamw][0] == pytest.approx(runs["for-loop"][0], rel=1e-6)
        # Adam divides by sqrt(v): on weights whose gradients are tiny, rounding differences
        # grow to ~1e-5 after 3 steps, against steps of up to lr = 3e-3
        torch.testing.assert_close(runs[adamw][1], runs["for-loop"][1], atol=ADAMW_ATOL, rtol=0)
    assert runs["for-loop"][0][-1] < runs["for-loop"][0][0]  # it trains


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


def test_py_spy_dump_shows_where_a_blocked_rank_waits(tmp_path) -> None:
    """Rank 0 waits in an all-reduce for 4 s while rank 1 sleeps; py-spy reads its stack.
    (The page's block runs the command line's --hang and its SIGTERM.)"""
    pid_file, ranks = tmp_path / "blocked.pid", []
    launcher = threading.Thread(target=lambda: ranks.extend(
        run_on_ranks(blocked_rank, 2, str(pid_file), 4.0, **TIMEOUTS)))  # fmt: skip
    launcher.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and launcher.is_alive():
        time.sleep(0.1)
    time.sleep(1)  # from writing the pid file into the all-reduce
    dump = subprocess.run(["py-spy", "dump", "--pid", pid_file.read_text()],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    launcher.join(timeout=60)
    assert ranks == [None, None]  # rank 1 came: both finished, nothing left running
    if dump.returncode and ("ermission" in dump.stderr or "not permitted" in dump.stderr):
        pytest.skip("py-spy needs ptrace: root, or CAP_SYS_PTRACE / ptrace_scope=0")
    assert dump.returncode == 0, dump.stderr
    frames = [line.split()[0] for line in dump.stdout.splitlines() if line.startswith(" ")]
    assert frames[0] == "all_reduce" and "blocked_rank" in frames, dump.stdout


def test_bad_input_is_one_line(capsys) -> None:
    assert "--adamw" in one_line_error(ProfileConfig, adamw="fast")
    assert "--steps" in one_line_error(ProfileConfig, steps=0)
    assert run_cli(main, ["--adamw", "fast"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
