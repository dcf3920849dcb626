# --8<-- [start:header]
"""Which positions of the sequence each rank holds, and the causal work that follows.

Try it:  python -c "from tinyscale.context_parallel.load_balance import demo; demo()"

Cut a sequence of T positions into N contiguous chunks and give rank r chunk r: with a
causal mask, rank r's queries attend to r + 1 chunks of keys, so the last rank works N
times as long as the first and every other rank waits for it. The head-tail split (the
``headtail`` load balancer of torchtitan, Megatron-LM's context parallelism) cuts the
sequence into 2N chunks and gives rank r chunks r and 2N - 1 - r: an early chunk with
little work and a late one with much, the same total on every rank.
"""

import dataclasses
from typing import Literal

import torch

from tinyscale.core.errors import UsageError

Kind = Literal["contiguous", "headtail"]
KINDS = ("contiguous", "headtail")

# --8<-- [end:header]


# --8<-- [start:split]
@dataclasses.dataclass(frozen=True)
class SequenceSplit:
    """How the positions of a sequence are dealt to ``world`` ranks."""

    world: int
    kind: Kind = "headtail"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"split kind {self.kind!r} is unknown: use one of {', '.join(KINDS)}")
        if self.world < 1:
            raise UsageError(f"a split over {self.world} ranks: use 1 or more ranks")

    @property
    def num_chunks(self) -> int:
        return self.world if self.kind == "contiguous" else 2 * self.world

    def chunks(self, rank: int) -> tuple[int, ...]:
        """The chunks rank ``rank`` holds, in the order it stores them."""
        if self.kind == "contiguous":
            return (rank,)
        return (rank, 2 * self.world - 1 - rank)  # head and tail

    def check_length(self, seq_len: int) -> int:
        """The chunk length; a length the chunks cannot share evenly is refused."""
        if seq_len % self.num_chunks:
            raise UsageError(
                f"sequence length {seq_len} does not split into {self.num_chunks} equal chunks "
                f"({self.kind}, {self.world} ranks): use a multiple of {self.num_chunks}"
            )
        return seq_len // self.num_chunks

    def positions(self, rank: int, seq_len: int) -> torch.Tensor:
        """The global positions rank ``rank`` holds: what its position embeddings must use."""
        c = self.check_length(seq_len)
        return torch.cat([torch.arange(i * c, (i + 1) * c) for i in self.chunks(rank)])

    def shard(self, x: torch.Tensor, rank: int, *, dim: int = 1) -> torch.Tensor:
        """The rank's positions of ``x`` along ``dim`` (the sequence dimension)."""
        return x.index_select(dim, self.positions(rank, x.shape[dim]).to(x.device))

    def unshard(self, parts: list[torch.Tensor], *, dim: int = 1) -> torch.Tensor:
        """Every rank's part back in sequence order (the inverse of ``shard``)."""
        seq_len = sum(p.shape[dim] for p in parts)
        order = torch.cat([self.positions(r, seq_len) for r in range(self.world)])
        return torch.cat(parts, dim=dim).index_select(dim, order.argsort().to(parts[0].device))


# --8<-- [end:split]


# --8<-- [start:work]
def tiles_needed(split: SequenceSplit, rank: int, source: int) -> list[tuple[int, int, bool]]:
    """(query chunk slot, key chunk slot, diagonal) of the tiles rank ``rank`` computes
    with the keys of rank ``source``: a key chunk after the query chunk is skipped whole."""
    return [
        (a, b, i == j)
        for a, i in enumerate(split.chunks(rank))
        for b, j in enumerate(split.chunks(source))
        if j <= i
    ]


def work_formula(split: SequenceSplit, rank: int, seq_len: int) -> tuple[int, int]:
    """(tiles, score entries) rank ``rank`` computes over the whole ring, on paper.

    Contiguous: r + 1 tiles of (T/N)² entries. Head-tail: chunk i needs i + 1 tiles of
    (T/2N)², so chunks r and 2N-1-r need 2N + 1 together, on every rank.
    """
    c = split.check_length(seq_len)
    tiles = rank + 1 if split.kind == "contiguous" else 2 * split.world + 1
    return tiles, tiles * c * c


def imbalance(work: list[int]) -> float:
    """The slowest rank's work over the mean: how long the step takes against a perfect split."""
    return max(work) / (sum(work) / len(work))


# --8<-- [end:work]


# --8<-- [start:demo]
def demo(world_size: int = 4, seq_len: int = 64) -> None:
    """The work per rank, on paper, for both splits (ring_attention's demo measures it)."""
    for kind in KINDS:
        split = SequenceSplit(world_size, kind)
        work = [work_formula(split, r, seq_len) for r in range(world_size)]
        held = ", ".join(str(split.chunks(r)) for r in range(world_size))
        print(f"{kind:>10}: chunks {held}")
        print(f"{'':>10}  tiles {[t for t, _ in work]}, score entries {[e for _, e in work]}, "
              f"slowest / mean {imbalance([e for _, e in work]):.2f}")  # fmt: skip


# --8<-- [end:demo]
