"""Lesson 10: hiding and shrinking communication.

    algorithms.py   four all-reduce algorithms (ring, recursive doubling, Rabenseifner,
                    segmented ring), their exact traffic and alpha-beta time, and the
                    selector all_reduce(comm, x) that picks one by size from measurements
    nonblocking.py  all_reduce_async(comm, x) -> handle; handle.wait(): the ring, in steps
                    driven by isend/irecv, so compute can run while it is in flight
    linear.py       AsyncColumnParallelLinear: backward starts the dX all-reduce, computes
                    dW meanwhile, then waits (Megatron's overlap of the two)
    collective_matmul.py     all-gather -> matmul and matmul -> reduce-scatter along T as p-step
                             rings that move the next chunk while multiplying the current one
                             (numpy on a Comm; the column and row layers, forward and backward)
    collective_matmul_nn.py  the same loops as torch autograd Functions, on a Comm or a ProcessGroup
    figures.py      the lesson's pictures (times by size, a backward timeline, the loops step by step)
    check.py        the claims above, checked on any backend (simulator, mpiexec, torchrun): the
                    algorithms and their traffic, the overlapping layer against the blocking one
                    and nn.Linear, the fused layers against Lesson 7's un-fused ones and the meter
"""
