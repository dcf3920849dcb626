"""Session C's recorded SLURM outputs still match what the batch file prints.

The page's bash blocks run the jobs for real in `make test` (as root on Debian), but a
job's id, times and tokens/s differ per run, so the page shows one recorded run. This
checks that every line of it could still be printed by today's batch file and lab:
the script's own lines, the probe step's variables, the port rule, the scontrol fields.
"""

import re

from helpers import ROOT

PAGE = ROOT / "docs" / "workshop" / "session-c.md"
BATCH = ROOT / "code" / "config" / "slurm_example.sbatch"


def recorded_blocks() -> list[str]:
    """The ```text blocks that follow a SLURM demo (they mention a job of ours), those
    inside a fold too (indented: the indent is taken off each line)."""
    found = re.findall(r"^( *)```text\n(.*?)^\1```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    blocks = [
        "\n".join(s.removeprefix(indent) for s in body.splitlines()) for indent, body in found
    ]
    return [b for b in blocks if re.search(r"^job \d+: ", b, re.MULTILINE)]


def test_the_page_records_completed_cancelled_and_requeued_jobs() -> None:
    blocks = recorded_blocks()
    assert len(blocks) == 2, "the two-job demo and the requeue demo"
    both = "\n".join(blocks)
    assert "JobState=COMPLETED ExitCode=0:0" in both
    assert "JobState=CANCELLED ExitCode=143:0" in both
    assert "JobState=COMPLETED Restarts=1 ExitCode=0:0" in both
    assert "resumed from step 5" in both


def test_every_recorded_line_is_one_the_batch_file_prints() -> None:
    batch = BATCH.read_text()
    # the echo lines of the batch file, with their variables turned into patterns
    header = re.compile(
        r"^job (\d+): 2 nodes \(node\[1-2\]\), rendezvous at node1:(\d+), launcher torchrun, restart (\d)$"
    )
    ending = re.compile(r"^job (\d+): exit code (\d+); per-rank logs in runs/slurm-(\d+)/logs$")
    for needle in (
        'echo "job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), rendezvous at '
        '$MASTER_ADDR:$MASTER_PORT, launcher $LAUNCHER, restart ${SLURM_RESTART_COUNT:-0}"',
        'echo "job $SLURM_JOB_ID: exit code $status; per-rank logs in $RUN_DIR/logs"',
        'echo "job $SLURM_JOB_ID: time limit near: requeue"',
        "SLURM_STEP_ID=$SLURM_STEP_ID SLURM_NODEID=$SLURM_NODEID",
    ):
        assert needle in batch, f"the batch file no longer prints {needle!r}: re-record the page"
    seen = 0
    for block in recorded_blocks():
        for line in block.splitlines():
            if m := header.match(line):
                job, port = int(m[1]), int(m[2])
                assert port == 20000 + job % 20000, line  # MASTER_PORT's rule
                seen += 1
            elif m := ending.match(line):
                assert m[1] == m[3], line  # RUN_DIR is runs/slurm-<job id>
                seen += 1
            elif line.startswith("job "):
                assert re.fullmatch(r"job \d+: time limit near: requeue", line), line
    assert seen >= 6
