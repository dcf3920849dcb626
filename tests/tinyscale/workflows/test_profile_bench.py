"""The benchmark run "Profiling and MFU" shows: docs/generated/workflows/profile_bench.txt,
written by tools/figures_workflows.py. Its variants are the benchmark's, its FLOP/s and MFU
follow from tokens/s and today's FLOPs formula, and the page's prose says what it measured."""

import re

from helpers import ROOT, load_script, prose
from tinyscale.core.config import load_model_config
from tinyscale.core.flops import flops_per_token

FILE = ROOT / "docs" / "generated" / "workflows" / "profile_bench.txt"
PAGE = "workflows/profiling.md"
ROW = re.compile(r"^(.+?) +([\d,]+) +([\d.]+)x +([\d.]+) +([\d.]+)%$")


def table() -> dict[str, tuple[float, float, float, float]]:
    rows = {}
    for line in FILE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rate, ratio, gflops, mfu = m[2].replace(",", ""), m[3], m[4], m[5]
            rows[m[1]] = (float(rate), float(ratio), float(gflops), float(mfu))
    return rows


def shares() -> dict[str, int]:
    text = FILE.read_text()
    found = dict(re.findall(r"([a-z/_' ]+?) (\d+) %", text.replace(",", "")))
    return {k.strip(): int(v) for k, v in found.items()}


def peak() -> float:
    return float(re.search(r"matmul peak ([\d.]+) GFLOP/s", FILE.read_text())[1])


def test_every_variant_of_the_benchmark_was_timed() -> None:
    bench = load_script("bench_profile_findings", folder="benchmarks")
    assert list(table()) == list(bench.VARIANTS)


def test_flops_and_mfu_follow_from_tokens_per_second_and_the_formula() -> None:
    rows, lab = table(), load_model_config("code/config/config.json")
    baseline = rows["Lab step (dropout 0.1, for-loop AdamW)"][0]
    for name, (rate, ratio, gflops, mfu) in rows.items():
        m = re.search(r"hidden (\d+)", name)
        cfg = lab if not m else lab.__class__(**{**lab.__dict__, "hidden_size": int(m[1]),
                                                 "intermediate_size": 4 * int(m[1])})  # fmt: skip
        expected = rate * flops_per_token(cfg, cfg.max_position_embeddings) / 1e9
        assert abs(gflops - expected) <= 0.01 * expected + 0.01, name
        assert abs(mfu - 100 * gflops / peak()) <= 0.2, name
        assert abs(ratio - rate / baseline) <= 0.01, name


def test_the_prose_says_what_the_run_measured() -> None:
    rows, part, text = table(), shares(), prose(PAGE)
    assert f"took {part['matmuls']} % of the self CPU time" in text
    assert 25 <= part["matmuls"] <= 45  # "about a third"
    assert part["dropout's bernoulli_"] < 20 and part["dropout"] < 20  # "not a fifth"
    assert f"took {part['embeddings/head']} %, more than attention ({part['attention']} %)" in text
    assert part["embeddings/head"] > part["attention"]
    bernoulli = part["dropout's bernoulli_"]
    assert f"random numbers took {bernoulli} %" in text
    assert f"their backward) took {part['dropout']} %" in text
    assert f"The optimizer is {part['optimizer']} % of this step" in text
    ratio = {name: f"{r[1]:.2f}×" for name, r in rows.items()}
    dropout0 = ratio["dropout 0 (fused attention, no RNG)"]
    assert f"train without): {dropout0} here" in text
    assert (
        f"foreach measured {ratio['AdamW foreach=True']} and fused {ratio['AdamW fused=True']}"
        in text
    )
    compiled, plain = (
        rows["dropout 0 + fused AdamW + torch.compile"],
        rows["dropout 0 + fused AdamW"],
    )
    assert compiled[1] < plain[1]  # "Here it did not pay"
    assert f"{compiled[1]:.2f}× with it, against {plain[1]:.2f}×" in text
    lab, wide = (
        rows["Lab step (dropout 0.1, for-loop AdamW)"],
        rows["dropout 0.1, fused AdamW, hidden 256"],
    )
    assert (
        f"{wide[3]:.1f} % of this CPU's matmul peak at hidden 256, against {lab[3]:.1f} %" in text
    )
    assert f"reached {lab[2]:.1f} GFLOP/s against a measured peak of {peak():.1f} GFLOP/s" in text
    assert f"**{lab[3]:.1f} % MFU**; {plain[3]:.1f} % with dropout 0" in text
