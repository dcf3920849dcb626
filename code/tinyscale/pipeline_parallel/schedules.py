# --8<-- [start:header]
"""Pipeline schedules as data: what each rank does, in which order, and how long it waits.

Try it:  python -c "from tinyscale.pipeline_parallel.schedules import demo; demo()"

A schedule is, per rank, an ordered list of actions: F (forward), B (backward) and, for
zero-bubble schedules, W (the weight-gradient half of a backward), each of one
micro-batch on one of the rank's model chunks. The same lists drive the event simulator
below and the real runtime (tinyscale.pipeline_parallel.pipeline). The schedules:

    naive        one micro-batch at a time through all stages (no pipelining)
    gpipe        all forwards, then all backwards    (Huang et al. 2019, arXiv:1811.06965)
    1f1b         warm-up, one forward one backward, cool-down
                 (PipeDream-Flush: Narayanan et al. 2019 and 2021, arXiv:2006.09503)
    interleaved  1F1B over v chunks per rank, Megatron-LM's order
                 (Narayanan et al. 2021, arXiv:2104.04473, §2.2.2)
    zb-h1        1F1B with the backward split into B (input grad) and W (weight grad),
                 W deferred into the bubbles (Qi et al. 2023, arXiv:2401.10241, §3)
"""

import dataclasses
from fractions import Fraction

from tinyscale.core.errors import UsageError

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


@dataclasses.dataclass(frozen=True)
class Action:
    """One step of one rank: ``kind`` F, B or W of ``microbatch`` on local model ``chunk``."""

    kind: str  # "F" forward, "B" backward (input grad only in zb-h1), "W" weight grad
    microbatch: int
    chunk: int = 0  # which of this rank's v model chunks (0 unless interleaved)

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def stage_of(rank: int, chunk: int, p: int) -> int:
    """The pipeline stage that chunk ``chunk`` of ``rank`` runs: Megatron puts chunk c of
    rank r at stage c·p + r, so a micro-batch visits every rank v times, in a loop."""
    return chunk * p + rank


# --8<-- [end:header]


# --8<-- [start:generators]
def naive(p: int, m: int) -> list[list[Action]]:
    """Micro-batch i goes forward through every stage and back before i + 1 starts."""
    return [[a for i in range(m) for a in (Action("F", i), Action("B", i))] for _ in range(p)]


def gpipe(p: int, m: int) -> list[list[Action]]:
    """All m forwards, then all m backwards: every rank holds m micro-batches' activations."""
    return [
        [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)] for _ in range(p)
    ]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """Rank r runs p - r - 1 forwards (warm-up), then alternates F and B, then drains the Bs.

    A backward frees a micro-batch's activations as soon as the pipeline allows, so rank r
    never holds more than p - r of them (GPipe holds m).
    """
    out = []
    for rank in range(p):
        warmup = min(p - rank - 1, m)
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: one forward, one backward
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warmup, m)]  # cool-down
        out.append(acts)
    return out


def interleaved(p: int, m: int, v: int) -> list[list[Action]]:
    """Megatron-LM's interleaved 1F1B: v chunks per rank, m a multiple of p.

    Micro-batches go in groups of p: the group's forwards on chunk 0, then on chunk 1, and
    so on; backwards in the same groups, chunks in reverse. Warm-up: 2(p - r - 1) + (v - 1)p
    forwards (all of them when m = p), then 1F1B, then the remaining backwards.
    """
    total = m * v  # actions of each kind on a rank

    def unit(k: int, kind: str) -> Action:
        chunk = (k // p) % v
        return Action(kind, (k // (p * v)) * p + k % p, v - 1 - chunk if kind == "B" else chunk)

    out = []
    for rank in range(p):
        warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
        acts = [unit(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            acts += [unit(warmup + k, "F"), unit(k, "B")]
        acts += [unit(k, "B") for k in range(total - warmup, total)]
        out.append(acts)
    return out


def zb_h1(p: int, m: int) -> list[list[Action]]:
    """ZB-H1: 1F1B's warm-up, then rank r defers its first r weight gradients (W).

    B (the input gradient) is what the previous stage waits for; W waits for nobody, so
    postponing it fills the bubbles of the cool-down. Order per rank, as in the paper's
    code: p - r - 1 F; r × (F B); then F B W; then B W; then the deferred Ws.
    """
    out = []
    for rank in range(p):
        acts: list[Action] = []
        f = b = w = 0
        for _ in range(min(p - rank - 1, m)):  # warm-up
            acts.append(Action("F", f))
            f += 1
        while f < m:
            acts += [Action("F", f), Action("B", b)]
            f, b = f + 1, b + 1
            if b > rank:  # after r deferred weight gradients, one W per B
                acts.append(Action("W", w))
                w += 1
        while b < m:
            acts.append(Action("B", b))
            b += 1
            if b > rank:
                acts.append(Action("W", w))
                w += 1
        acts += [Action("W", i) for i in range(w, m)]  # the deferred ones fill the tail
        out.append(acts)
    return out


def make_schedule(name: str, *, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """The action lists of schedule ``name`` for p ranks, m micro-batches, v chunks per rank."""
    check_schedule(name, p=p, m=m, v=v)
    if name == "interleaved":
        return interleaved(p, m, v)
    return {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](p, m)


def check_schedule(name: str, *, p: int, m: int, v: int) -> None:
    """One line naming the fix for a schedule that cannot run."""
    if name not in SCHEDULES:
        raise UsageError(f"unknown schedule {name!r}: use --schedule {', '.join(SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise UsageError(f"p={p}, m={m}, v={v}: ranks, micro-batches and chunks must be >= 1")
    if name == "interleaved" and m % p:
        raise UsageError(
            f"interleaved needs the micro-batches ({m}) to be a multiple of the pipeline "
            f"ranks ({p}): use --microbatches {p * max(1, round(m / p))}"
        )
    if name != "interleaved" and v != 1:
        raise UsageError(f"schedule {name!r} runs one chunk per rank: use --chunks 1")


# --8<-- [end:generators]


# --8<-- [start:simulate]
@dataclasses.dataclass(frozen=True)
class Timed:
    """An action of ``rank`` placed in time by the simulator (or measured by the runtime)."""

    rank: int
    action: Action
    start: Fraction | float
    end: Fraction | float


def simulate(
    actions: list[list[Action]], *, v: int = 1, t_f=1, t_b=2, t_w=0, t_comm=0, replay=None
) -> list[list[Timed]]:
    """Place every action in time: each rank runs its list in order, as soon as it can.

    Dependencies: F of stage s after F of stage s - 1 (same micro-batch); B of stage s
    after B of stage s + 1, or after its own F on the last stage; W after its B. A
    message between ranks takes ``t_comm``. Durations: F ``t_f``, B ``t_b``, W ``t_w``,
    and a backward that is not split (no W in the schedule) ``t_b + t_w``. Give ints or
    Fractions and every time is exact. ``replay``: a measured timeline of the same lists,
    whose own durations replace the t's (what the run would take with no message delays).
    """
    p = len(actions)
    last = v * p - 1
    split = any(a.kind == "W" for acts in actions for a in acts)
    cost = {"F": t_f, "B": t_b if split else t_b + t_w, "W": t_w}
    done: dict[tuple[str, int, int], Fraction] = {}  # (kind, microbatch, stage) -> end
    placed: list[list[Timed]] = [[] for _ in range(p)]
    free = [Fraction(0)] * p  # when each rank finishes its last placed action
    while any(len(placed[r]) < len(actions[r]) for r in range(p)):
        progress = False
        for r in range(p):
            while len(placed[r]) < len(actions[r]):
                a = actions[r][len(placed[r])]
                s = stage_of(r, a.chunk, p)
                need = {  # (what, on which stage, message between ranks?)
                    "F": ("F", s - 1, True) if s > 0 else None,
                    "B": ("B", s + 1, True) if s < last else ("F", s, False),
                    "W": ("B", s, False),
                }[a.kind]
                start = free[r]
                if need:
                    kind, stage, message = need
                    if (kind, a.microbatch, stage) not in done:
                        break  # not ready yet: try the other ranks
                    ready = done[kind, a.microbatch, stage] + (t_comm if message else 0)
                    start = max(start, ready)
                k = len(placed[r])
                end = start + (
                    cost[a.kind] if replay is None else replay[r][k].end - replay[r][k].start
                )
                done[a.kind, a.microbatch, s] = free[r] = end
                placed[r].append(Timed(r, a, start, end))
                progress = True
        if not progress:
            stuck = {
                r: str(actions[r][len(placed[r])])
                for r in range(p)
                if len(placed[r]) < len(actions[r])
            }
            raise UsageError(f"the schedule deadlocks: each rank waits, next actions {stuck}")
    return placed


def bubble(timeline: list[list[Timed]]) -> list[Fraction]:
    """Per rank: idle time / total time, the total being the whole step (first start to last end)."""
    total = max(t.end for rank in timeline for t in rank) - min(t.start for t in timeline[0])
    return [(total - sum(t.end - t.start for t in rank)) / total for rank in timeline]


def message_delay(timeline: list[list[Timed]], *, v: int = 1) -> float:
    """The median time from a send's end to the receiving action's start, where the receiver
    was already waiting: what a real run adds per hop (the simulator's ``t_comm``)."""
    p = len(timeline)
    end = {(t.action.kind, t.action.microbatch, stage_of(t.rank, t.action.chunk, p)): t.end
           for rank in timeline for t in rank}  # fmt: skip
    delays = []
    for rank in timeline:
        for before, t in zip([None, *rank], rank, strict=False):
            a, s = t.action, stage_of(t.rank, t.action.chunk, p)
            source = {"F": ("F", a.microbatch, s - 1), "B": ("B", a.microbatch, s + 1)}
            sent = end.get(source.get(a.kind))
            if sent is not None and (before is None or before.end <= sent):
                delays.append(t.start - sent)  # the receiver was idle: all of it is the message
    return sorted(delays)[len(delays) // 2]


def bubble_fraction(p: int, m: int, v: int = 1) -> Fraction:
    """GPipe's and 1F1B's (v = 1) and interleaved 1F1B's idle share: (p - 1) / (v·m + p - 1).

    The p - 1 ramp-up and ramp-down slots of one chunk's F + B, against v·m of work.
    """
    return Fraction(p - 1, v * m + p - 1)


def zb_h1_bubble_fraction(p: int, m: int, *, t_f=1, t_b=1, t_w=1) -> Fraction:
    """ZB-H1's idle share: (p - 1)(t_f + t_b - t_w) idle against m(t_f + t_b + t_w) of work.

    1F1B idles (p - 1)(t_f + t_b + t_w): deferring W takes 2(p - 1)t_w off (Qi et al. §3.1).
    Exact, the simulator shows, when m >= p and W is no longer than F or B.
    """
    idle = (p - 1) * (t_f + t_b - t_w)
    return Fraction(idle) / (m * (t_f + t_b + t_w) + idle)


def peak_in_flight(acts: list[Action]) -> int:
    """The most micro-batches whose activations a rank keeps at once, read off its list.

    A forward keeps them; the backward frees them (zb-h1: only the W frees the last ones).
    """
    frees = "W" if any(a.kind == "W" for a in acts) else "B"
    alive = peak = 0
    for a in acts:
        alive += 1 if a.kind == "F" else -1 if a.kind == frees else 0
        peak = max(peak, alive)
    return peak


# --8<-- [end:simulate]


# --8<-- [start:demo]
def demo(p: int = 4, m: int = 8) -> None:
    """Per schedule: the simulated bubble of every rank against the formula, and the peak."""
    print(f"p = {p} ranks, m = {m} micro-batches, t_f = 1, t_b = 2 (zb-h1: B = W = 1)")
    print("schedule     v  bubble per rank (simulated)   formula  peak micro-batches per rank")
    for name, v in (("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)):
        acts = make_schedule(name, p=p, m=m, v=v)
        # interleaved: a chunk is 1/v of a rank's layers, so 1/v of the time
        t = {"t_f": Fraction(1, v), "t_b": Fraction(2, v)}
        if name == "zb-h1":
            t = {"t_f": 1, "t_b": 1, "t_w": 1}
        sim = bubble(simulate(acts, v=v, **t))
        formula = {"naive": Fraction(p - 1, p), "zb-h1": zb_h1_bubble_fraction(p, m)}.get(
            name, bubble_fraction(p, m, v)
        )
        shown = " ".join(f"{b!s:>5}" for b in sim)
        peaks = " ".join(str(peak_in_flight(a)) for a in acts)
        print(f"{name:<11} {v:>2}  {shown:<28}  {formula!s:>7}  {peaks}")


# --8<-- [end:demo]
