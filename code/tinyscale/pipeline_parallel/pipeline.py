# --8<-- [start:header]
"""A pipeline-parallel runtime from scratch: run a schedule's actions on this rank's stages.

Try it:  python -c "from tinyscale.pipeline_parallel.pipeline import demo; demo()"

Every rank builds the same TinyTransformer (same seed), cuts it into p·v stages with
``cut_into_stages`` and keeps its own: chunk c of rank r is stage c·p + r. A step splits
the batch into m micro-batches and runs the rank's action list from
tinyscale.pipeline_parallel.schedules: F receives an activation (or reads token ids), runs
the stage and sends its output on; B receives the output's gradient, back-propagates and
sends the input's gradient back. Each micro-batch's loss is divided by m, so the gradients
that accumulate are those of the mean loss: one process on the whole batch gets the same.
Only core torch.distributed: isend / irecv (tinyscale.pipeline_parallel.p2p) and all_reduce.
"""

import copy
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.parallel_layout import ParallelLayout, job_timeout, new_subgroup
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import ModelStage, TinyTransformer, cut_into_stages
from tinyscale.core.parity import largest_difference
from tinyscale.pipeline_parallel.p2p import ACTIVATION, GRADIENT, StageLink
from tinyscale.pipeline_parallel.schedules import Action, Timed, make_schedule, stage_of

# --8<-- [end:header]


# --8<-- [start:config]
@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    schedule: str = "1f1b"  # one of schedules.SCHEDULES
    microbatches: int = 4  # m: the batch is cut into m equal micro-batches
    chunks: int = 1  # v: model chunks per rank (interleaved only)
    timeout_s: float = 30.0  # the longest wait for a neighbour's message
    sleep: tuple[float, float, float] = (0.0, 0.0, 0.0)  # stand-in compute: s per F, B, W


def split_layers(num_layers: int, stages: int) -> list[range]:
    """Cut ``num_layers`` blocks into ``stages`` contiguous runs, the first ones 1 longer."""
    if stages > num_layers:
        raise UsageError(
            f"{stages} pipeline stages but the model has {num_layers} blocks: use at most "
            f"{num_layers} stages (--pp x chunks per rank) or a model with more layers"
        )
    sizes = [num_layers // stages + (s < num_layers % stages) for s in range(stages)]
    starts = [sum(sizes[:s]) for s in range(stages)]
    return [range(a, a + n) for a, n in zip(starts, sizes, strict=True)]


def check_pipeline(config: PipelineConfig, *, world: int, degree: int, batch_size: int) -> None:
    """One line naming the fix, before any process waits on another."""
    make_schedule(config.schedule, p=degree, m=config.microbatches, v=config.chunks)
    if degree > world:
        raise UsageError(
            f"pipeline degree {degree} needs {degree} processes, the world has {world}: "
            f"launch {degree} ranks or use --pipeline-degree {world}"
        )
    if world % degree:
        raise UsageError(
            f"world size {world} is not a multiple of the pipeline degree {degree}: use a "
            f"degree that divides it"
        )
    if world != degree:
        raise UsageError(
            f"world size {world} holds {world // degree} pipelines: this runtime runs one, "
            f"so use --pipeline-degree {world} (data parallel over pipelines is Week 4)"
        )
    if batch_size % config.microbatches:
        raise UsageError(
            f"batch size {batch_size} is not divisible by --microbatches "
            f"{config.microbatches}: every micro-batch must have the same shape"
        )


# --8<-- [end:config]


# --8<-- [start:memory]
class SavedActivations:
    """Which micro-batches' activations autograd holds now, seen through saved-tensor hooks.

    Every tensor autograd saves for backward goes through ``pack``; we wrap it in a small
    object tagged with its (micro-batch, chunk). When autograd frees the graph after the
    backward, the wrappers die and the micro-batch leaves the count.
    """

    def __init__(self) -> None:
        self.alive: Counter[tuple[int, int]] = Counter()  # saved tensors per micro-batch
        self.peak = 0

    @contextmanager
    def tagged(self, key: tuple[int, int]) -> Iterator[None]:
        counter = self

        class Saved:
            def __init__(self, tensor: torch.Tensor) -> None:
                self.tensor = tensor
                counter.alive[key] += 1
                counter.peak = max(counter.peak, len(counter.alive))

            def __del__(self) -> None:
                counter.alive[key] -= 1
                if not counter.alive[key]:
                    del counter.alive[key]

        with torch.autograd.graph.saved_tensors_hooks(Saved, lambda saved: saved.tensor):
            yield


# --8<-- [end:memory]


# --8<-- [start:init]
class Pipeline:
    """This rank's stages and its part of a schedule. Usage, on every rank:

    loss = pipe.step(input_ids, targets); optimizer.step(); optimizer.zero_grad()

    One pipeline over the world by default. Week 4's 3D parallelism passes a ``layout``
    (this rank's pipeline is its line along "pp", in global ranks), a ``split`` applied
    to each of this rank's stages (tensor parallelism) and the ``loss`` of its logits.
    """

    def __init__(
        self, model: TinyTransformer, *, config: PipelineConfig, batch_shape: tuple[int, int],
        layout: ParallelLayout | None = None, split: Callable[[ModelStage], ModelStage] | None = None,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = TinyTransformer.loss,
    ) -> None:  # fmt: skip
        layout = layout or ParallelLayout(pp=dist.get_world_size())
        self.ranks = layout.group_of("pp", dist.get_rank())  # global ranks, one per stage
        self.rank, self.p = self.ranks.index(dist.get_rank()), layout.pp  # place in the pipeline
        B, T = batch_shape
        check_pipeline(config, world=self.p, degree=self.p, batch_size=B)
        self.config, self.loss, m, v = config, loss, config.microbatches, config.chunks
        stages = cut_into_stages(model, split_layers(model.cfg.num_hidden_layers, self.p * v))
        mine = [stages[stage_of(self.rank, c, self.p)] for c in range(v)]
        self.stages: list[ModelStage] = [split(s) for s in mine] if split else mine
        self.last_stage = len(stages) - 1
        self.actions: list[Action] = make_schedule(config.schedule, p=self.p, m=m, v=v)[self.rank]
        self.link = StageLink(shape=(B // m, T, model.cfg.hidden_size), microbatches=m,
                              timeout_s=config.timeout_s)  # fmt: skip
        # Tied tok_emb / lm_head: one matrix on the first stage (rank 0) and the last (rank
        # p - 1). Each gets a part of its gradient; Megatron sums them in a 2-rank group.
        self.tied = None
        if model.cfg.tie_word_embeddings and self.p > 1:  # every rank makes every pair's group
            pairs = [[line[0], line[-1]] for line in layout.groups("pp")]
            group = new_subgroup(pairs, job_timeout())  # None on the middle stages
            if self.rank == 0:  # the first stage's embedding
                self.tied, self.tied_group = self.stages[0].tok_emb.weight, group
            elif self.rank == self.p - 1:  # the last stage's head
                self.tied, self.tied_group = self.stages[-1].lm_head.weight, group
        self.saved: dict[tuple[int, int], tuple] = {}  # (micro-batch, chunk) -> F's tensors
        self.activations = SavedActivations()
        self.events: list[Timed] = []
        t_f, t_b, t_w = config.sleep  # an unsplit backward does both halves
        split = config.schedule == "zb-h1"
        self.sleep = {"F": t_f, "B": t_b if split else t_b + t_w, "W": t_w}

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (each once): what its optimizer updates."""
        return list({id(p): p for s in self.stages for p in s.parameters()}.values())

    def named_parameters(self) -> dict[str, nn.Parameter]:
        return {n: p for s in self.stages for n, p in s.named_parameters()}

    # --8<-- [end:init]

    # --8<-- [start:step]
    def step(self, input_ids: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Run this rank's actions on the micro-batches; return the loss on the last stage."""
        m = self.config.microbatches
        xs, ys = input_ids.chunk(m), targets.chunk(m)  # m x (B/m, T)
        self.losses: list[torch.Tensor] = []
        self.events, self.activations.peak = [], 0
        dist.barrier()  # a common start, so that every rank's clock reads from the same moment
        self.t0 = time.perf_counter()
        for action in self.actions:
            self.run(action, xs, ys)
        self.link.flush()
        if self.tied is not None:  # the sum of both stages' parts: the gradient of one matrix
            dist.all_reduce(self.tied.grad, group=self.tied_group)
        return sum(loss.item() for loss in self.losses) if self.losses else None

    def run(self, a: Action, xs: tuple[torch.Tensor, ...], ys: tuple[torch.Tensor, ...]) -> None:
        s = stage_of(self.rank, a.chunk, self.p)  # the global stage this action runs
        stage, key, mb = self.stages[a.chunk], (a.microbatch, a.chunk), a.microbatch
        message = None  # (tensor, to rank, kind, receiving stage): sent once computed
        if a.kind == "F":
            if stage.first:
                x = xs[mb]  # (B/m, T) token ids
            else:
                source = self.ranks[(s - 1) % self.p]
                x = self.link.recv(source=source, kind=ACTIVATION, stage=s, mb=mb)
                x.requires_grad_()  # (B/m, T, C): we want its gradient, to send it back
            start = time.perf_counter()
            with self.activations.tagged(key):
                out = stage(x)  # (B/m, T, C), or the logits (B/m, T, vocab) on the last stage
                if stage.last:  # divided by m: the m micro-batch losses add up to the mean
                    out = self.loss(out, ys[mb]) / self.config.microbatches
                    self.losses.append(out.detach())
            if not stage.last:
                message = (out, self.ranks[(s + 1) % self.p], ACTIVATION, s + 1)
            self.saved[key] = (x, out, None)
        elif a.kind == "B":
            x, out, _ = self.saved[key]
            grad = None  # the loss needs none; other stages get it from the next stage
            if not stage.last:
                source = self.ranks[(s + 1) % self.p]
                grad = self.link.recv(source=source, kind=GRADIENT, stage=s, mb=mb)
            start = time.perf_counter()
            if self.config.schedule != "zb-h1":  # the whole backward: weights' and x's grads
                torch.autograd.backward(out, grad)
                del self.saved[key]  # autograd has freed the graph; drop our references
                dx = x.grad
            else:  # B of zb-h1: only the input's gradient; keep the graph for W
                self.saved[key] = (x, out, grad)
                if not stage.first:
                    (dx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
            if not stage.first:
                message = (dx, self.ranks[(s - 1) % self.p], GRADIENT, s - 1)
        else:  # W: the weight gradients, off the critical path
            x, out, grad = self.saved.pop(key)
            start = time.perf_counter()
            torch.autograd.backward(out, grad, inputs=list(stage.parameters()))
        time.sleep(self.sleep[a.kind])  # stand-in compute, to time the bubble (0 by default)
        end = time.perf_counter()
        if message is not None:
            tensor, to, kind, receiver = message
            self.link.send(tensor, to=to, kind=kind, stage=receiver, mb=mb)
        self.events.append(Timed(self.rank, a, start - self.t0, end - self.t0))

    # --8<-- [end:step]


# --8<-- [start:parity]
def random_tokens(cfg, *, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(cfg.vocab_size, (batch_size, cfg.max_position_embeddings + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # inputs (B, T), targets (B, T)


@torch.no_grad()
def sgd_step(params: list[nn.Parameter], *, lr: float) -> None:
    """p <- p - lr * grad: torch.optim.SGD without momentum. The gradients stay, to compare."""
    for p in params:
        p.add_(p.grad, alpha=-lr)


def compare_with_one_process(
    config: PipelineConfig, *, layers: int = 4, tied: bool = True, lr: float = 0.1,
    steps: int = 2, batch_size: int = 8, seed: int = 0,
) -> dict:  # fmt: skip
    """On every rank: our pipeline and one process on the whole batch, from the same init.

    Returns the largest difference of this rank's weights and last gradients from the
    single process's after ``steps`` SGD steps, the losses, the peak micro-batches in
    flight, the bytes sent, and the last step's events. SGD written out: creating a
    torch.optim optimizer imports torch._dynamo, seconds per process on a small CPU.
    """
    cfg = preset("tiny", num_hidden_layers=layers, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    ref = TinyTransformer(cfg)
    model = copy.deepcopy(ref)
    pipe = Pipeline(model, config=config, batch_shape=(batch_size, cfg.max_position_embeddings))
    with CollectiveCounter() as counter:
        for step in range(steps):
            x, y = random_tokens(cfg, batch_size=batch_size, seed=seed + step)
            for p in [*ref.parameters(), *pipe.parameters()]:
                p.grad = None  # a fresh accumulation each step
            ref_loss = ref(x, y)[1]
            ref_loss.backward()
            sgd_step(list(ref.parameters()), lr=lr)
            counter.clear()  # count the last step only
            loss = pipe.step(x, y)
            sgd_step(pipe.parameters(), lr=lr)
    mine, theirs = pipe.named_parameters(), dict(ref.named_parameters(remove_duplicate=False))
    return {
        "weights": max(largest_difference(p, theirs[n]) for n, p in mine.items()),
        "grads": max(largest_difference(p.grad, theirs[n].grad) for n, p in mine.items()),
        "loss": None if loss is None else abs(loss - ref_loss.item()),
        "peak": pipe.activations.peak,
        "sent": sum(c.nbytes for c in counter.calls if c.op == "isend"),
        "all_reduced": sum(c.nbytes for c in counter.calls if c.op == "all_reduce"),
        "events": pipe.events,
    }


# --8<-- [end:parity]


# --8<-- [start:demo]
def parity_table() -> list[str]:
    """Rank by rank, per schedule: |pipeline - one process| after 2 SGD steps."""
    rows, layers = [], 2 * dist.get_world_size()  # interleaved: 2 chunks of a block per rank
    for name, v in (("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)):
        r = compare_with_one_process(PipelineConfig(schedule=name, microbatches=4, chunks=v),
                                     layers=layers)  # fmt: skip
        diff = max(r["weights"], r["grads"])
        rows.append(f"{name:<11}  {'ok' if diff < 1e-5 else f'{diff:.1e}'}  {r['peak']}")
    return rows


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(parity_table, world_size, deadline_s=300)
    print(f"p = {world_size}, m = 4, tied embeddings, 2 SGD steps against one process")
    print("schedule     |diff| < 1e-5, peak micro-batches per rank")
    for rows in zip(*ranks, strict=True):
        name = rows[0].split()[0]
        oks = {r.split()[1] for r in rows}
        print(f"{name:<11}  {'ok' if oks == {'ok'} else ' '.join(oks)}  "
              f"{' '.join(r.split()[2] for r in rows)}")  # fmt: skip


# --8<-- [end:demo]
