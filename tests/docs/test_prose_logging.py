"""Numbers in the prose of "Logging" (docs/workflows/logging.md) that no output block shows:
how often W&B samples the system metrics here, against the course's setting
(tinyscale.workflows.wandb_log.SYSTEM_EVERY_S), and W&B's own default, against the
installed wandb's settings.
"""

from __future__ import annotations

import pytest
import wandb

from helpers import fails_when_changed, prose, said
from tinyscale.workflows import wandb_log

PAGE = "workflows/logging.md"
PER_SECOND = {"twice": 2, "once": 1, "four times": 4}


def check_sampling(text: str) -> None:
    every, default = said(
        text,
        r"W&B samples the system metrics (twice|once|four times) a second here; its default, "
        r"every (\d+) seconds, suits real jobs",
    )
    assert 1 / PER_SECOND[every] == wandb_log.SYSTEM_EVERY_S
    assert float(default) == wandb.Settings().x_stats_sampling_interval


def test_the_pages_numbers_are_the_settings() -> None:
    check_sampling(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_sampling, "twice a second here", "four times a second here"),
        (check_sampling, "every 15 seconds", "every 10 seconds"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
