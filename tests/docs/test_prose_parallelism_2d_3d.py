"""2D and 3D parallelism: the numbers in its prose are those of its data.

The page's demos are CI-compared outputs (`recorded_output`); its formulas are the code's.

- the messages: the tensor group's 4 all-reduces per block (the TP lesson's recorded
  count); ZeRO-1's reduce sends half an all-reduce's bytes, a DDP wrapper 1.5 times
  ZeRO-1's (tinyscale.comm.counter's ring accounting);
- ZeRO-1 around any optimizer: the SGD momentum (the code), the state per rank (recorded),
  the embedding that is one rank's share on 4 ranks (the partition);
- 2D: the Adam state per rank against the calculator's 8 bytes per parameter;
- the ladder: its learning rate, the float32 spacing near its losses, the test's tolerance;
- the planner: 6 N + 12 L T d FLOPs per token (core.flops) and at most a third more with
  recomputation, the run's activations, the 7B and 70B shapes (core.config presets), the 70B model's activations against an H100, the memory margin;
- 3D: the losses within two float32 spacings, the weights, what each axis divides (the
  0.67 of the activations: not a half), the tied group's bytes;
- Exercises 2 and 3: the t = 4 factor and the broken rung's gap.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from helpers import fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.comm.counter import Call
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed import ladder
from tinyscale.composed.planner import Cluster, Workload, evaluate
from tinyscale.composed.two_d import tensor_step_bytes
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.flops import flops_per_token, matmul_weights
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel import sharded_optimizer
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate

PAGE = "week-4/parallelism-2d-3d.md"
GiB = 2**30
WORDS = {"half": 1 / 2, "twice": 2, "a third": 1 / 3}


def output(command: str) -> str:
    return "\n".join(recorded_output(PAGE, command))


def number(text: str) -> float:
    return float(text.replace(",", ""))


def spacing(x: float) -> float:
    """The distance from a float32 to the next one."""
    return float(np.spacing(np.float32(x)))


def check_tensor_messages(text: str) -> None:
    (times,) = said(text, r"shares each layer's matrices and all-reduces activations, (\d) times")
    demo = "\n".join(
        recorded_output("week-4/tensor-parallel-from-scratch.md", "tp_parity import demo")
    )
    found = re.search(r"forward \{'all_reduce': (\d)\}, backward \{'all_reduce': (\d)\}", demo)
    assert found and int(found[1]) + int(found[2]) == int(times)


def check_reduce_and_broadcast(text: str) -> None:
    (share,) = said(
        text,
        r"sends each owner just its parameters' sum, \(N − 1\)/N of the gradients per rank, "
        r"(half) the 2\(N − 1\)/N of an all-reduce",
    )
    (times,) = said(text, r"would send 2\(N − 1\)/N \+ \(N − 1\)/N of them, ([\d.]+) times as much")
    for n in (2, 4, 8):
        sent = {
            op: Call(op, nbytes=4096, numel=1024, ranks=n).sent_bytes()
            for op in ("reduce", "broadcast", "all_reduce")
        }
        assert sent["reduce"] == WORDS[share] * sent["all_reduce"]
        assert sent["all_reduce"] == 2 * (n - 1) / n * 4096
        zero1 = sent["reduce"] + sent["broadcast"]
        assert zero1 == sent["all_reduce"], "ZeRO-1 sends as much as DDP"
        assert (sent["all_reduce"] + sent["broadcast"]) / zero1 == float(times)


def check_zero1_demo(text: str) -> None:
    (momentum,) = said(text, r"with AdamW and with SGD \(momentum ([\d.]+)\):")
    source = inspect.getsource(sharded_optimizer.against_torch)
    assert re.findall(r'"momentum": ([\d.]+)', source) == [momentum]
    share, params = said(
        text,
        r"Each rank keeps the state of (half) of the ([\d,]+) parameters: SGD's momentum holds "
        r"one number per parameter",
    )
    sgd = re.search(r"SGD: .* state elements per rank ([\d,]+), ([\d,]+) \(parameters ([\d,]+)\)",
                    output("sharded_optimizer import demo"))  # fmt: skip
    assert sgd and number(sgd[3]) == number(params)
    assert number(sgd[1]) == number(sgd[2]) == WORDS[share] * number(params)
    (embedding,) = said(text, r"There the embedding alone \(([\d,]+) parameters\) is one rank's")
    model = TinyTransformer(preset("tiny"))
    sizes = [p.numel() for p in model.parameters()]
    owners = sharded_optimizer.partition(sizes, 4)
    mine = [n for n, owner in zip(sizes, owners, strict=True) if owner == owners[0]]  # tok_emb
    assert mine == [model.tok_emb.weight.numel()] == [number(embedding)]


def check_2d_memory(text: str) -> None:
    found = said(
        text,
        r"and the Adam state of about (half) of it: ([\d,]+) and ([\d,]+) elements against the "
        r"calculator's (\d) bytes × ([\d,]+) / 2 = ([\d,]+) bytes = ([\d,]+) elements\. The "
        r"difference is one (\d+)-element bias",
    )
    share, high, low, per_param, params, state_bytes, elements, bias = found
    rows = re.findall(
        r"([\d,]+) parameters, ([\d,]+) optimizer-state elements", output("two_d import demo")
    )
    assert {number(p) for p, _ in rows} == {number(params)}
    assert {number(s) for _, s in rows} == {number(high), number(low)}
    assert int(per_param) == 2 * 4, "Adam's two fp32 moments"
    assert number(params) * int(per_param) * WORDS[share] == number(state_bytes)
    assert number(state_bytes) / 4 == number(elements) == number(params)
    assert number(high) - number(elements) == number(elements) - number(low) == int(bias)
    assert int(bias) == preset("tiny").hidden_size, "a bias is one number per channel"


def check_ladder(text: str) -> None:
    (lr,) = said(text, r"3 AdamW steps \(learning rate ([\de-]+)\)")
    assert float(lr) == ladder.LR
    near, step = said(
        text,
        r"The differences are the last bit of a float32 loss near ([\d.]+) \(its spacing there "
        r"is ([\d.e-]+)\)",
    )
    table = output("ladder import demo")
    losses = [float(x) for x in re.findall(r"\b\d\.\d{6}\b", table)]
    assert losses and {spacing(x) for x in losses} == {spacing(float(near))}
    assert float(step) == float(f"{spacing(float(near)):.1e}")
    assert max(float(x) for x in re.findall(r"\d\.\de-\d\d", table)) == float(f"{float(step):.1e}")
    (bound,) = said(text, r"holds every rung within ([\de-]+) of one process")
    assert float(bound) == load_script("test_ladder", "tests/tinyscale/composed").TOLERANCE


def check_time_model(text: str) -> None:
    weights, attention, more, forwards = said(
        text,
        r"compute runs at the GPU's peak \((\d+) N \+ (\d+) L T d FLOPs per token, the formula "
        r"of\s+\[Profiling and MFU\].{0,200}?; at most (a third) more with `--recompute full`, "
        r"which runs every\s+block's forward (twice)",
    )
    cfg, cluster, T = preset("tiny"), Cluster(gpus=1), 16
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    assert (
        flops_per_token(cfg, T) == int(weights) * matmul_weights(cfg) + int(attention) * L * T * d
    )

    def more_compute(cfg: ModelConfig, T: int) -> float:
        per_token = {}
        for mode in ("none", "full"):
            w = Workload(model=cfg, seq_len=T, global_batch=4, recompute=mode)
            step = evaluate(w, cluster, ParallelLayout(), zero=0).step_s  # compute alone
            per_token[mode] = step * cluster.peak_tflops * 1e12 / (w.global_batch * w.seq_len)
        assert per_token["none"] == pytest.approx(flops_per_token(cfg, T), rel=1e-12)
        return per_token["full"] / per_token["none"] - 1

    forward = 1 / 3  # of each term: 2 N and 4 L T d forward, 4 N and 8 L T d backward
    assert WORDS[more] == (WORDS[forwards] - 1) * forward
    assert more_compute(cfg, T) < WORDS[more]  # the head's forward is not run again
    (trades,) = said(text, r"That trades about (a third) more\s+compute for room\.")
    assert more_compute(preset("70b"), 8192) == pytest.approx(WORDS[trades], rel=0.01)


def check_this_run(text: str) -> None:
    (activations,) = said(
        text, r"with sequence parallelism, ([\d,]+) bytes of activations: the numbers Step 3"
    )
    w = Workload(model=preset("tiny"), seq_len=16, global_batch=8, micro_batch=4, precision="fp32")
    p = evaluate(w, Cluster(gpus=4, gpus_per_node=4), ParallelLayout(dp_replicate=2, tp=2), zero=1)
    assert p.activations == number(activations)  # test_two_d.py: what the TP lesson measured


def check_seven_b(text: str) -> None:
    name, blocks, width, seq, batch, half = said(
        text,
        r"A (\d+)B model of the course's family \((\d+) blocks of width ([\d,]+)\) on 2 nodes of "
        r"8 H100s, sequences of ([\d,]+) tokens, (\d+) sequences per step \((half) a million",
    )
    cfg = preset(f"{name}b")
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (int(blocks), number(width))
    assert round(number(seq) * int(batch), -5) == WORDS[half] * 1e6
    assert f"--seq-len {number(seq):.0f} --global-batch {batch}" in text


def check_seventy_b(text: str) -> None:
    name, blocks, width = said(
        text, r"A (\d+)B model \((\d+) blocks of width ([\d,]+)\) on 8 nodes"
    )
    cfg = preset(f"{name}b")
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (int(blocks), number(width))
    found = said(
        text,
        r"One sequence of ([\d,]+) tokens through (\d+) blocks of width ([\d,]+) saves about "
        r"(\d+) GiB of activations, more than (twice) an H100's (\d+) GB\. Only a split of every "
        r"block, (\d) ways, with sequence parallelism, brings that down to (\d+) GiB per GPU\.",
    )
    seq, blocks_again, width_again, whole, times, h100, ways, split = found
    assert (int(blocks_again), number(width_again)) == (cfg.num_hidden_layers, cfg.hidden_size)
    one = activation_bytes_estimate(cfg, micro_batch=1, seq_len=int(number(seq)), precision="bf16")
    assert round(one / GiB, -1) == int(whole)
    assert Cluster(gpus=1).memory_gb == int(h100) and one > WORDS[times] * int(h100) * 1e9
    tp = activation_bytes_estimate(cfg, micro_batch=1, seq_len=int(number(seq)), precision="bf16",
                                   tensor_parallel=int(ways), sequence_parallel=True)  # fmt: skip
    assert round(tp / GiB) == int(split)
    fastest = output("--model 70b").splitlines()[1]
    assert f"tp {ways} x pp 1" in fastest and f"activations {tp / GiB:.1f} GiB" in fastest


def check_margin(text: str) -> None:
    (margin,) = said(text, r"memory fragmentation and workspaces \(the (\d+) % margin\)")
    assert round(100 * (1 - Cluster(gpus=1).usable)) == int(margin)


def three_d() -> dict[str, dict]:
    """Grid -> its rank rows and formula rows, from the 3D demo's recorded output."""
    grids: dict[str, dict] = {}
    for line in recorded_output(PAGE, "three_d import demo"):
        if head := re.match(r"(dp \d x pp \d x tp \d): loss .* one process ([\d.e+-]+)$", line):
            grid = grids.setdefault(head[1], {"loss": float(head[2]), "ranks": [], "formulas": {}})
        elif row := re.match(r"(\d+)\s+\((\d), (\d), (\d)\)\s+(\d)((?:\s+[\d,]+)+) x (\d)", line):
            params, adam, acts = (number(x) for x in row[6].split())
            grid["ranks"].append({"stage": int(row[2]), "params": params, "adam": adam,
                                  "activations": acts, "tied": number(line.split()[-2])})  # fmt: skip
        elif row := re.match(r"formulas, stage (\d)((?:\s+[\d,]+)+)$", line):
            grid["formulas"][int(row[1])] = [number(x) for x in row[2].split()]
        elif weights := re.search(r"weights after 3 steps within ([\d.e-]+)", line):
            grid["weights"] = float(weights[1])
    return grids


def check_three_d(text: str) -> None:
    grids = three_d()
    within, count, near = said(
        text, r"within ([\d.e-]+) \((one|two) float32 spacings? near ([\d.]+)\) at every"
    )
    assert max(g["loss"] for g in grids.values()) == float(within)
    spacings = {"one": 1, "two": 2}[count]
    assert float(within) == float(f"{spacings * spacing(float(near)):.1e}")
    (weights,) = said(text, r"The weights after 3 AdamW steps are within ([\de-]+), the same Adam")
    assert max(g["weights"] for g in grids.values()) == float(weights)

    found = said(
        text,
        r"Tensor parallelism cuts a stage's parameters to ([\d.]+) of tp 1's \(([\d,]+) at tp 1, "
        r"([\d,]+) at tp 2: .{20,90}\) and its saved activations to ([\d.]+) \(([\d,]+) bytes, "
        r"then ([\d,]+): without sequence parallelism, what the norms save stays whole\); data "
        r"parallelism (halves) the Adam state \(([\d,]+) elements at dp 1, ([\d,]+) at dp 2 with "
        r"tp 2, within one parameter",
    )
    p_ratio, p1, p2, a_ratio, a1, a2, halves, adam1, adam2 = found
    tp1 = [r for r in grids["dp 2 x pp 2 x tp 1"]["ranks"] if r["stage"] == 0]
    tp2 = [r for r in grids["dp 1 x pp 2 x tp 2"]["ranks"] if r["stage"] == 0]
    assert {r["params"] for r in tp1} == {number(p1)} and {r["params"] for r in tp2} == {number(p2)}
    assert {r["activations"] for r in tp1} == {number(a1)}
    assert {r["activations"] for r in tp2} == {number(a2)}
    assert round(number(p2) / number(p1), 2) == float(p_ratio)
    assert round(number(a2) / number(a1), 2) == float(a_ratio) != 0.5, "the activations: not half"
    assert {r["adam"] for r in tp2} == {number(adam1)}  # dp 1
    dp2 = grids["dp 2 x pp 2 x tp 2"]
    assert dp2["formulas"][0][1] == number(adam2) == number(adam1) / 2, halves
    measured = [r["adam"] for r in dp2["ranks"] if r["stage"] == 0]
    largest = preset("tiny").vocab_size // 2 * preset("tiny").hidden_size  # tok_emb's rows
    assert sum(measured) == 2 * number(adam1) and all(
        abs(m - number(adam2)) <= 2 * largest for m in measured
    ), "ZeRO-1 owns whole parameters: each rank's state is within one parameter of half"

    tied_tp2, share, tied_tp1 = said(
        text, r"([\d,]+) bytes per step at tp 2, (half) of the ([\d,]+) at tp 1\."
    )
    assert {r["tied"] for r in tp2} == {number(tied_tp2)}
    assert {r["tied"] for r in tp1} == {number(tied_tp1)}
    assert number(tied_tp2) == WORDS[share] * number(tied_tp1)


def check_exercise_2(text: str) -> None:
    (factor,) = said(text, r"Only the factor 2\(t − 1\)/t changes: from 1 at t = 2 to ([\d.]+) at")
    assert 2 * (4 - 1) / 4 == float(factor)
    recorded = dict(re.findall(r"tp (\d): ([\d,]+) B", output("tensor_step_bytes(cfg, batch=4")))
    assert number(recorded["4"]) / number(recorded["2"]) == float(factor)
    cfg = preset("tiny")
    assert tensor_step_bytes(cfg, batch=4, seq_len=16, tp=4) == number(recorded["4"])


def check_exercise_3(text: str) -> None:
    second, third, times, ladder_gap = said(
        text,
        r"the gap grows: ([\d.e-]+), then ([\d.e-]+), over a (thousand times) the ladder's "
        r"([\d.e-]+)\.",
    )
    gaps = dict(re.findall(r"step (\d): ([\d.e+-]+)", output("run_on_ranks(rung, 2")))
    assert float(gaps["1"]) == 0.0
    assert (float(gaps["2"]), float(gaps["3"])) == (float(second), float(third))
    table = output("ladder import demo")
    assert max(float(x) for x in re.findall(r"\d\.\de-\d\d", table)) == float(ladder_gap)
    assert min(float(second), float(third)) > {"thousand times": 1000}[times] * float(ladder_gap)


CHECKS = [
    check_tensor_messages,
    check_reduce_and_broadcast,
    check_zero1_demo,
    check_2d_memory,
    check_ladder,
    check_time_model,
    check_this_run,
    check_seven_b,
    check_seventy_b,
    check_margin,
    check_three_d,
    check_exercise_2,
    check_exercise_3,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_tensor_messages, "activations, 4 times per block", "activations, 2 times per block"),
        (check_reduce_and_broadcast, "of them, 1.5 times as much", "of them, 2 times as much"),
        (check_zero1_demo, "(momentum 0.9)", "(momentum 0.99)"),
        (check_2d_memory, "one 32-element bias", "one 64-element bias"),
        (check_ladder, "(learning rate 1e-2)", "(learning rate 1e-3)"),
        (check_ladder, "within 1e-5 of one process", "within 1e-6 of one process"),
        (check_time_model, "That trades about a third more", "That trades about half more"),
        (check_time_model, "(6 N + 12 L T d FLOPs", "(6 N + 6 L T d FLOPs"),
        (check_seventy_b, "about 160 GiB of activations", "about 80 GiB of activations"),
        (check_seventy_b, "down to 38 GiB per GPU", "down to 20 GiB per GPU"),
        (check_margin, "(the 15 % margin)", "(the 10 % margin)"),
        (check_three_d, "saved activations to 0.67", "saved activations to 0.5"),
        (check_three_d, "are within 4e-05, the", "are within 3e-05, the"),
        (check_exercise_3, "then 5.3e-3, over", "then 5.3e-4, over"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
