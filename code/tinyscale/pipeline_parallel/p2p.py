# --8<-- [start:header]
"""Point-to-point messages between pipeline stages: activations forward, gradients back.

Try it:  python -c "from tinyscale.pipeline_parallel.p2p import demo; demo()"

Neighbouring stages exchange one (B/m, T, C) tensor per micro-batch each way. Every
micro-batch has the same shape, known from the config, so both sides agree on it up front
and no shape travels (torch.distributed.pipelining's stages infer it once instead). Sends
are ``isend``s whose handles we keep until the step ends; receives are ``irecv``s whose
wait is bounded, so a peer that never sends becomes an error that says who waited for what.
"""

import dataclasses
from datetime import timedelta

import torch
import torch.distributed as dist

from tinyscale.core.errors import UsageError

ACTIVATION, GRADIENT = 0, 1  # what a message carries: forward or backward


class PeerTimeout(RuntimeError):
    """A receive or send that did not complete in time: the peer is missing or out of step."""


# --8<-- [end:header]


# --8<-- [start:link]
@dataclasses.dataclass(kw_only=True)
class StageLink:
    """This rank's sends and receives, for micro-batches of one agreed shape.

    A message is named by a tag: (what, the stage that receives it, micro-batch). Gloo
    matches a receive to the send with the same source and tag, so the order in which
    two ranks post their messages does not have to agree.
    """

    shape: tuple[int, ...]  # (B/m, T, C): one micro-batch's activations
    microbatches: int
    dtype: torch.dtype = torch.float32
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        self.pending: list[tuple[dist.Work, torch.Tensor, str]] = []  # sends in flight

    def tag(self, kind: int, stage: int, microbatch: int) -> int:
        return (2 * stage + kind) * self.microbatches + microbatch

    def send(self, tensor: torch.Tensor, *, to: int, kind: int, stage: int, mb: int) -> None:
        """Post the send and return at once; ``flush`` waits for it (the tensor stays alive)."""
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            raise UsageError(
                f"stage {stage - 1 if kind == ACTIVATION else stage + 1} sends "
                f"{tensor.dtype} {tuple(tensor.shape)}, the stages agreed on {self.dtype} "
                f"{self.shape}: give every micro-batch the same shape (batch divisible by m)"
            )
        tensor = tensor.detach().contiguous()
        work = dist.isend(tensor, dst=to, tag=self.tag(kind, stage, mb))
        self.pending.append((work, tensor, f"{_name(kind)} of micro-batch {mb} to rank {to}"))

    def recv(self, *, source: int, kind: int, stage: int, mb: int) -> torch.Tensor:
        """Block until the message arrives, at most ``timeout_s``."""
        buffer = torch.empty(self.shape, dtype=self.dtype)  # (B/m, T, C), agreed up front
        work = dist.irecv(buffer, src=source, tag=self.tag(kind, stage, mb))
        self._wait(work, f"{_name(kind)} of micro-batch {mb} from rank {source}")
        return buffer

    def flush(self) -> None:
        """Wait for every send posted: at the end of a step, before the buffers are reused."""
        for work, _, what in self.pending:
            self._wait(work, f"the send of {what}")
        self.pending.clear()

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as err:
            raise PeerTimeout(
                f"rank {dist.get_rank()} waited {self.timeout_s:g} s for {what}: that rank "
                f"is missing, crashed or runs another schedule ({str(err).splitlines()[0]})"
            ) from None


def _name(kind: int) -> str:
    return "the activation" if kind == ACTIVATION else "the gradient"


# --8<-- [end:link]


# --8<-- [start:demo]
def missing_peer(timeout_s: float = 1.0) -> str:
    """Rank 1 waits for an activation that rank 0 never sends: a clear error, not a hang."""
    store = dist.distributed_c10d._get_default_store()  # to keep rank 0 alive meanwhile
    if dist.get_rank() == 0:
        store.wait(["rank1-gave-up"], timedelta(seconds=10 * timeout_s))
        return "rank 0 sent nothing"
    link = StageLink(shape=(2, 4, 8), microbatches=1, timeout_s=timeout_s)
    try:
        link.recv(source=0, kind=ACTIVATION, stage=1, mb=0)
    except PeerTimeout as err:
        return str(err).split(" (")[0]  # gloo's own words (with a file path) aside
    finally:
        store.set("rank1-gave-up", "1")
    return "received?"


def demo() -> None:
    from tinyscale.comm.launch import run_on_ranks

    print(run_on_ranks(missing_peer, 2)[1])


# --8<-- [end:demo]
