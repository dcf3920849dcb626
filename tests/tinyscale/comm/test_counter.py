"""tinyscale.comm.counter: every call logged with the size of its whole buffer and its group.

One gloo process in this process checks the sizes call by call (including keyword calls and
the pre-2.10 names DeepSpeed uses); one spawn of 3 ranks checks the point-to-point calls, a
batch of them through P2POp, all_to_all_single with uneven splits, a subgroup's size, and
the two accountings against values worked out by hand.
"""

import torch
import torch.distributed as dist

from tinyscale.comm.counter import Call, CollectiveCounter
from tinyscale.comm.launch import run_on_ranks


def test_sizes_are_the_whole_buffer_in_every_call_form(process_group_of_one) -> None:
    counter = CollectiveCounter()
    with counter:
        dist.all_reduce(torch.ones(10))
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(6))  # the gathered 6
        dist.all_gather_single(output_tensor=torch.empty(5), input_tensor=torch.ones(5))
        dist.reduce_scatter_tensor(output=torch.empty(3), input=torch.ones(3))  # the 3 in
        dist.broadcast(torch.ones(4, dtype=torch.float64), src=0)
        with counter.paused():
            dist.all_reduce(torch.ones(100))  # a check, not part of what is measured
    assert [(c.op, c.numel, c.nbytes, c.ranks) for c in counter.calls] == [
        ("all_reduce", 10, 40, 1),
        ("all_gather_into_tensor", 6, 24, 1),
        ("all_gather_single", 5, 20, 1),
        ("reduce_scatter_tensor", 3, 12, 1),
        ("broadcast", 4, 32, 1),
    ]
    assert counter.volume() == 2 * 10 + 6 + 5 + 3 + 4  # an all-reduce counts twice
    assert counter.sent_bytes() == 0.0  # one rank sends nothing to anyone


def test_removing_puts_torchs_functions_back(process_group_of_one) -> None:
    original = dist.all_reduce, dist.isend, dist.P2POp
    with CollectiveCounter():
        assert dist.all_reduce is not original[0]
    assert (dist.all_reduce, dist.isend, dist.P2POp) == original


def test_the_ring_accounting_by_hand() -> None:
    assert Call("all_reduce", 4000, 1000, 4).sent_bytes() == 2 * 3 / 4 * 4000
    assert Call("all_gather_single", 4000, 1000, 4).sent_bytes() == 3 / 4 * 4000
    assert Call("isend", 400, 100, 4).sent_bytes() == 400
    assert Call("irecv", 400, 100, 4).sent_bytes() == 0 and Call("irecv", 400, 100, 4).volume() == 0


def exchange() -> dict:
    """On every rank of 3: a ring of point-to-point calls, a batch, an uneven all-to-all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    counter = CollectiveCounter()
    with counter:
        got = torch.empty(8)
        if rank % 2 == 0:  # a blocking ring of 3 needs an order: even ranks send first
            dist.send(torch.full((8,), float(rank)), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(torch.full((8,), float(rank)), right)
        batch = [
            dist.P2POp(dist.isend, torch.ones(5), right),
            dist.P2POp(dist.irecv, torch.empty(5), left),
        ]
        for work in dist.batch_isend_irecv(batch):
            work.wait()
        # rank r sends r + 1 elements to every rank: uneven splits
        out_splits = [r + 1 for r in range(world)]
        sent = torch.full(((rank + 1) * world,), float(rank))
        received = torch.empty(sum(out_splits))
        dist.all_to_all_single(received, sent, out_splits, [rank + 1] * world)
        pair = dist.new_group([0, 1])
        if rank < 2:
            dist.all_reduce(torch.ones(2), group=pair)
    return {
        "ops": [(c.op, c.numel, c.ranks) for c in counter.calls],
        "left": got[0].item(),
        "received": received.tolist(),
    }


def test_point_to_point_batches_and_all_to_all_on_three_ranks() -> None:
    ranks = run_on_ranks(exchange, 3, timeout_s=30, deadline_s=90)
    for rank, r in enumerate(ranks):
        send_recv = [("send", 8, 3), ("recv", 8, 3)]
        if rank % 2:
            send_recv.reverse()
        expected = [
            *send_recv,
            ("isend", 5, 3),
            ("irecv", 5, 3),
            ("all_to_all_single", 3 * (rank + 1), 3),
        ]
        if rank < 2:
            expected.append(("all_reduce", 2, 2))  # the subgroup's size, not the world's
        assert r["ops"] == expected
        assert r["left"] == float((rank - 1) % 3)  # the calls still do their work
        assert r["received"] == [float(s) for s in range(3) for _ in range(s + 1)]
