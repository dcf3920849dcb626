"""Tensor parallelism with torchtitan: the numbers in its prose are those of its configs.

tests/tinyscale/compat/test_titan_tp.py checks the runs, the plan and most sizes; this
file checks the rest against tinyscale.compat.titan_config.tinyscale_tp:

- the TP config runs 3 steps with a TP degree of 2, and the 2-D config the same 3;
- every "half" that states a share is 1 / that degree: the features a column-wise or
  row-wise layer holds, the tokens whose logits a rank has, the FFN's useful width when
  its two halves start equal;
- the debug model's vocabulary, in the logits that are never gathered.
"""

from __future__ import annotations

import pytest

from helpers import fails_when_changed, prose, said

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

PAGE = "week-4/tensor-parallel-torchtitan.md"
SHARE = {"half": 2, "a quarter": 4}


def tp_config():
    from tinyscale.compat.titan_config import tinyscale_tp

    return tinyscale_tp()


def check_config(text: str) -> None:
    degree, steps = said(
        text, r"one with a TP degree of (\d)\. It also runs (\d) steps, and writes no checkpoint"
    )
    config = tp_config()
    assert config.parallelism.tensor_parallel_degree == int(degree)
    assert config.training.steps == int(steps) and not config.checkpoint.enable
    (same,) = said(text, r"Then 2-D: FSDP 2 × TP 2 on four processes, the same (\d) steps:")
    from tinyscale.compat.titan_config import tinyscale_fsdp_tp

    assert tinyscale_fsdp_tp().training.steps == int(same) == int(steps)


def check_shares(text: str) -> None:
    degree = tp_config().parallelism.tensor_parallel_degree
    found = said(
        text,
        r"\(out features, in features\): (half) of the output features each\. Their output is "
        r"`Shard\(-1\)`: each rank has its (half) of the features, for every position\. - "
        r"\*\*Row-wise\*\*: `wo` and `w2` hold `Shard\(1\)`: (half) of the input features",
    )
    found += said(text, r"`lm_head` is column-wise over the vocabulary: each rank has the logits "
                        r"of (half) the tokens")  # fmt: skip
    found += said(text, r"The FFN trains as if it had (half) its width\.")
    assert {SHARE[share] for share in found} == {degree}


def check_vocabulary(text: str) -> None:
    (vocab,) = said(text, r"the B × T × ([\d,]+) logits are never gathered")
    model = tp_config().model_spec.model
    assert model.lm_head.out_features == int(vocab.replace(",", ""))


@pytest.mark.parametrize("check", [check_config, check_shares, check_vocabulary])
def test_the_pages_numbers_are_those_of_the_config(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_config, "It also runs 3 steps", "It also runs 5 steps"),
        (check_config, "processes, the same 3 steps:", "processes, the same 4 steps:"),
        (check_shares, "as if it had half its width", "as if it had a quarter its width"),
        (check_vocabulary, "B × T × 2,048 logits", "B × T × 4,096 logits"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
