"""The simulator runs SPMD code on threads and never hangs: it names deadlocks, mismatched
collectives and failing ranks within seconds, and its meter counts every byte."""
import time

import numpy as np
import pytest

from tp_from_scratch import collectives
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng


def test_results_come_back_in_rank_order_with_args_and_kwargs():
    out = run_spmd(lambda comm, a, b=0: (comm.rank, comm.world_size, a, b), 3, "x", b=5)
    assert out == [(0, 3, "x", 5), (1, 3, "x", 5), (2, 3, "x", 5)]


def test_messages_arrive_in_order_and_are_private_copies():
    def fn(comm):
        if comm.rank == 0:
            x = random_array(rank_rng(1, 0), (4, 3))
            sent = [x.copy()]
            comm.send(x, 1)
            x += 100.0  # overwriting after send must not change what rank 1 receives
            comm.send(x, 1)
            return sent + [x.copy()]
        return [comm.recv(0), comm.recv(0)]

    sent, got = run_spmd(fn, 2)
    for i in range(2):
        assert_matches_reference(got[i], sent[i], name=f"message {i}", rank=1, exact=True)


def test_meter_counts_point_to_point_and_books_outermost_collective_only():
    def fn(comm):
        x = np.zeros((6, 2), np.float32)  # 48 bytes
        comm.send(x, (comm.rank + 1) % 2)
        comm.recv((comm.rank - 1) % 2)
        collectives.all_reduce(comm, x)
        return comm.meter.snapshot(), comm.meter.table()

    (snap, table), _ = run_spmd(fn, 2)
    # p2p: 1 message of 48 bytes; all_reduce on p=2: 2 messages of 24 bytes
    assert snap["messages_sent"] == 3 and snap["bytes_sent"] == 48 + 48
    assert snap["messages_received"] == 3 and snap["bytes_received"] == 96
    assert set(snap["by_collective"]) == {"all_reduce"}  # not reduce_scatter / all_gather
    assert snap["by_collective"]["all_reduce"] == {
        "calls": 1, "messages_sent": 2, "bytes_sent": 48, "messages_received": 2, "bytes_received": 48}
    assert "all_reduce" in table and "(point-to-point)" in table and "total" in table


def test_meter_reset_and_snapshot_is_a_copy():
    def fn(comm):
        collectives.all_gather(comm, np.ones(4))
        before = comm.meter.snapshot()
        comm.meter.reset()
        return before, comm.meter.snapshot()

    before, after = run_spmd(fn, 3)[0]
    assert before["bytes_sent"] == 2 * 32 and before["by_collective"]["all_gather"]["calls"] == 1
    assert after == {"messages_sent": 0, "bytes_sent": 0, "messages_received": 0,
                     "bytes_received": 0, "by_collective": {}}


def test_barrier_releases_every_rank_repeatedly():
    def fn(comm):
        for _ in range(5):
            comm.barrier()
        return True

    assert run_spmd(fn, 4) == [True] * 4


# ---- never hang -----------------------------------------------------------------------
def _raises_fast(fn, world_size, match, limit=5.0, **kw):
    start = time.monotonic()
    with pytest.raises(SPMDError, match=match) as info:
        run_spmd(fn, world_size, timeout=60, **kw)
    assert time.monotonic() - start < limit, "diagnosed by the timeout, not by detection"
    return info.value


def test_deadlock_names_who_waits_on_whom_at_once():
    def fn(comm):  # both ranks receive first: the classic ring bug
        x = comm.recv(1 - comm.rank)
        comm.send(x, 1 - comm.rank)

    err = _raises_fast(fn, 2, "deadlock: rank 0 waits for a message from rank 1; "
                               "rank 1 waits for a message from rank 0")
    assert "test_comm_simulated.py" in str(err)  # where each rank waits


def test_deadlock_inside_a_collective_names_the_collective():
    def fn(comm):
        with comm.collective("my_ring", None):
            comm.recv((comm.rank - 1) % comm.world_size)

    _raises_fast(fn, 3, r"rank 2 waits for a message from rank 1 \(in my_ring\)")


def test_waiting_for_a_rank_that_returned_is_a_deadlock():
    def fn(comm):
        if comm.rank == 0:
            comm.recv(1)

    _raises_fast(fn, 2, "rank 0 waits for a message from rank 1, which has already returned")


def test_barrier_missed_by_a_returned_rank_is_a_deadlock():
    def fn(comm):
        if comm.rank != 2:
            comm.barrier()

    _raises_fast(fn, 3, r"waits in barrier, but rank\(s\) \[2\] have already returned")


def test_barrier_against_recv_is_a_deadlock():
    def fn(comm):
        comm.barrier() if comm.rank == 0 else comm.recv(0)

    _raises_fast(fn, 2, "rank 0 waits in barrier; rank 1 waits for a message from rank 0")


@pytest.mark.parametrize("case, match", [
    ("names", "rank 2 is in all_reduce, rank 0 is in all_gather"),
    ("shape", r"all_reduce with shape=\(5,\).*all_reduce with shape=\(4,\)"),
    ("dtype", "all_reduce with dtype='float32'.*dtype='float64'"),
    ("root", "broadcast with root=1.*broadcast with root=0"),
    ("numpy root", "broadcast with root=1.*broadcast with root=0"),
    ("op", "all_reduce with op='max'.*op='sum'"),
])
def test_collective_mismatch_is_named(case, match):
    def fn(comm):
        late = comm.rank == 2
        if late:
            time.sleep(0.05)  # rank 2 arrives last, so it is the one that reports
        if case == "names":
            return collectives.all_reduce(comm, np.ones(4)) if late else collectives.all_gather(comm, np.ones(4))
        if case == "shape":
            return collectives.all_reduce(comm, np.ones(5 if late else 4))
        if case == "dtype":
            return collectives.all_reduce(comm, np.ones(4, np.float32 if late else np.float64))
        if case == "root":
            return collectives.broadcast(comm, np.ones(4), root=1 if late else 0)
        if case == "numpy root":  # a root computed with numpy must print like a plain int
            return collectives.broadcast(comm, np.ones(4), root=np.int64(1 if late else 0))
        return collectives.all_reduce(comm, np.ones(4), op="max" if late else "sum")

    _raises_fast(fn, 3, match)


def test_exception_on_one_rank_stops_all_and_names_it():
    def fn(comm):
        if comm.rank == 2:
            raise ValueError("boom on purpose")
        while True:  # the others would wait forever for rank 2
            comm.recv(2)

    err = _raises_fast(fn, 4, "rank 2 failed: ValueError: boom on purpose")
    assert err.rank == 2 and isinstance(err.error, ValueError)
    assert "raise ValueError" in err.traceback and "in fn" in err.traceback


def test_timeout_is_the_backstop_for_a_rank_that_never_communicates():
    def fn(comm):
        if comm.rank == 1:
            time.sleep(2.5)  # busy elsewhere: not a deadlock the simulator can prove
        else:
            comm.recv(1)

    start = time.monotonic()
    with pytest.raises(SPMDError, match=r"timeout: rank 0 waited 0.3 s.*rank 1 is running"):
        run_spmd(fn, 2, timeout=0.3)
    assert time.monotonic() - start < 2.4  # the caller does not wait for the sleeping rank


def test_bad_peer_and_bad_world_size_are_named():
    with pytest.raises(SPMDError, match=r"rank 0: send to rank 5 does not exist \(world_size is 2\)"):
        run_spmd(lambda comm: comm.send(np.ones(1), 5) if comm.rank == 0 else None, 2)
    with pytest.raises(SPMDError, match="rank 0: send to rank 1 needs an array, got None"):
        run_spmd(lambda comm: comm.send(None, 1) if comm.rank == 0 else None, 2)
    with pytest.raises(SPMDError, match="rank 1: send to rank 0 needs a numeric array, got dtype object"):
        run_spmd(lambda comm: comm.send([{}, 1], 0) if comm.rank == 1 else None, 2)
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        run_spmd(lambda comm: None, 0)


def test_messages_with_and_without_a_header_interleave_and_are_metered_alike():
    def fn(comm):
        rng, other = rank_rng(3, comm.rank), 1 - comm.rank
        mine = [random_array(rng, (4, 3)), random_array(rng, (2,)), random_array(rng, (5,))]
        for x, header in zip(mine, (False, True, False)):
            comm.send(x, other, header=header)
        out = np.empty((4, 3))
        got = [comm.recv(other, out=out, header=False), comm.recv(other),
               comm.recv(other, out=np.empty(5), header=False)]
        assert got[0] is out
        return mine, got, comm.meter.snapshot()

    results = run_spmd(fn, 2)
    for rank, (_, got, meter) in enumerate(results):
        sent = results[1 - rank][0]
        for k, (g, s) in enumerate(zip(got, sent)):
            assert_matches_reference(g, s, name=f"message {k}", rank=rank, exact=True)
        nbytes = sum(s.nbytes for s in sent)
        assert (meter["messages_received"], meter["bytes_received"]) == (3, nbytes)


@pytest.mark.parametrize("send_header, recv_header, said", [
    (True, False, "rank 0 sent rank 1 a message with a header, but rank 1 receives it without"),
    (False, True, r"rank 0 sent rank 1 a message without a header \(header=False\), but rank 1 "
                  "receives it with a header"),
])
def test_sender_and_receiver_must_agree_on_the_header(send_header, recv_header, said):
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.ones(3), 1, header=send_header)
        else:
            comm.recv(0, out=np.empty(3), header=recv_header)

    with pytest.raises(SPMDError, match=said):
        run_spmd(fn, 2)


def test_headerless_recv_needs_out_and_a_buffer_of_the_right_shape():
    with pytest.raises(SPMDError, match="recv from rank 0 with header=False needs out="):
        run_spmd(lambda comm: comm.recv(0, header=False) if comm.rank == 1 else None, 2)

    def fn(comm):
        if comm.rank == 0:
            comm.send(np.ones(6), 1, header=False)
        else:
            comm.recv(0, out=np.empty((2, 3)), header=False)  # same bytes, another shape

    with pytest.raises(SPMDError, match=r"into an array of shape \(2, 3\) and dtype float64, "
                                        r"but the message has shape \(6,\)"):
        run_spmd(fn, 2)


def test_recv_into_out_fills_it_and_checks_shape_and_dtype():
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(6.0).reshape(2, 3), 1)
            comm.send(np.arange(6.0), 1)
            return None
        out = np.zeros((2, 3))
        got = comm.recv(0, out=out)
        assert got is out
        assert_matches_reference(out, np.arange(6.0).reshape(2, 3), name="recv into out", rank=1, exact=True)
        comm.recv(0, out=np.zeros(6, np.float32))  # wrong dtype: must be named

    with pytest.raises(SPMDError, match=r"rank 1: recv from rank 0 into an array of shape \(6,\) "
                                        r"and dtype float32, but the message has shape \(6,\) and dtype float64"):
        run_spmd(fn, 2)


def test_a_rank_computing_forever_is_stopped_after_a_failure():
    import threading

    def fn(comm):
        if comm.rank == 0:
            raise ValueError("rank 0 gives up")
        while True:  # never calls comm again: only an interruption from outside can stop it
            pass

    with pytest.raises(SPMDError, match="rank 0 failed: ValueError"):
        run_spmd(fn, 2)
    deadline = time.monotonic() + 5
    while any(t.name.startswith("spmd-rank") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("spmd-rank")]
