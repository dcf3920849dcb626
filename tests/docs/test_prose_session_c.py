"""Session C's numbers, read from the page and compared with the data (numbers in prose
come from data):

- the two-job demo: the steps the short job runs (its command and its recorded summary),
  its run time and training time, from the recorded run the page shows (whose lines
  tests/docs/test_session_c.py checks against the batch file);
- the cluster's and the batch file's settings: `MinJobAge` in
  tools/slurm/slurm.conf.template, the time-limit warning's `--signal=B:USR1@<seconds>` in
  code/config/slurm_example.sbatch;
- the requeued job's losses, from its recorded run, and the uninterrupted run's final loss
  at the same step (Lab 2's 2-process run, docs/generated/lab2/world_sizes.json).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from helpers import ROOT, fails_when_changed, prose, said

PAGE = "workshop/session-c.md"
BATCH = ROOT / "code" / "config" / "slurm_example.sbatch"
SLURM_CONF = ROOT / "tools" / "slurm" / "slurm.conf.template"


def check_two_jobs(text: str) -> None:
    (steps,) = said(text, r"both the Lab 2 script on 2 nodes\. The first runs (\d+) steps; the")
    (flag,) = said(
        text, r"short=\$\(sbatch --parsable code/config/slurm_example\.sbatch --max-steps (\d+)\)"
    )
    (summary,) = said(
        text,
        r"rank 0/2 local_rank 0 \| summary: (\d+) steps \| final loss [\d.]+ \| held-out loss [\d.]+ \| [\d,]+ tokens/s over 2 ranks job 1:",
    )
    assert steps == flag == summary
    job_s, train_s = said(text, r"A (\d+)-second job that trains for (\d+) seconds\.")
    (runtime,) = said(text, r"JobId=1 JobState=COMPLETED ExitCode=0:0 RunTime=00:00:(\d+)")
    assert int(job_s) == int(runtime)
    stamps = re.findall(
        r"0: 2026-11-22 (\d\d:\d\d:\d\d,\d{3}) rank 0/2 local_rank 0 \| (torchrun|summary:)", text
    )
    first = next(t for t, what in stamps if what == "torchrun")
    last = next(t for t, what in stamps if what == "summary:")
    clock = [datetime.strptime(t, "%H:%M:%S,%f") for t in (first, last)]
    assert int(train_s) == round((clock[1] - clock[0]).total_seconds())


def check_settings(text: str) -> None:
    (minutes,) = said(text, r"which remembers ended jobs for `MinJobAge` = (\d+) minutes")
    assert int(re.search(r"^MinJobAge=(\d+)$", SLURM_CONF.read_text(), re.M)[1]) == 60 * int(
        minutes
    )
    (warning,) = set(re.findall(r"^#SBATCH --signal=B:USR1@(\d+)", BATCH.read_text(), re.M))
    said_seconds = [
        *said(text, r"The batch file asks SLURM for a warning (\d+) seconds before the limit"),
        *said(text, r"`: (\d+) seconds before the limit, SLURM sends `USR1` to the batch shell"),
        *said(text, r"with a real limit: the warning comes by itself (\d+) s before it\."),
        *said(
            text,
            r"and gets the USR1 warning (\d+) s before its limit\. With the course's batch file",
        ),
        *said(text, r"then requeue\. The (\d+) s must cover one step plus the save\."),
    ]
    assert said_seconds == [warning] * 5


def check_requeue(text: str) -> None:
    final, heldout, steps = said(
        text,
        r"and ended with final loss ([\d.]+) and held-out loss ([\d.]+) — exactly what the same "
        r"(\d+) steps give when never interrupted",
    )
    recorded = said(
        text,
        r"summary: (\d+) steps \| final loss ([\d.]+) \| held-out loss ([\d.]+) \| [\d,]+ tokens/s "
        r"over 2 ranks job 3:",
    )
    assert recorded == (steps, final, heldout)
    runs = json.loads((ROOT / "docs" / "generated" / "lab2" / "world_sizes.json").read_text())
    ranks = runs["runs"]["2"]["losses"]["0"]
    at = next(r for r in ranks if r["step"] == int(steps))
    assert float(final) == at["global_loss"], "an uninterrupted run of 2 processes, same step"


CHECKS = [check_two_jobs, check_settings, check_requeue]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_two_jobs, "trains for 2 seconds", "trains for 5 seconds"),
        (check_two_jobs, "The first runs 10 steps", "The first runs 20 steps"),
        (check_settings, "`MinJobAge` = 10 minutes", "`MinJobAge` = 5 minutes"),
        (check_settings, "The 60 s must cover", "The 30 s must cover"),
        (check_requeue, "ended with final loss 6.0924", "ended with final loss 6.0942"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
