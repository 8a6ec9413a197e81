"""Measure this machine for Lesson 9's cost model: matmul FLOP/s, seconds per element of each
element-wise op, the per-step overhead, and alpha and beta of gloo's all-reduce and of ours.

    .venv/bin/python -m tp_from_scratch.cost.planner --calibrate     # writes runs/profile.json

``calibrate`` runs the single-process measurements here and launches the all-reduce fits on 2
and 4 processes (torchrun, and mpiexec where installed), each worker being

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.cost.calibrate --worker runs/fit.json
"""
import argparse
import json
from pathlib import Path

from tp_from_scratch.collectives import ring_messages

# ---------------------------------------------------------------------------------------
# Calibration: measure this machine
# ---------------------------------------------------------------------------------------

def fit_line(xs, ys):
    """Least-squares (intercept, slope) of ys = intercept + slope * xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def measure_matmul_flops(threads, sizes=((1024, 512, 2048), (1024, 1024, 1024), (1024, 2048, 512)),
                         repeats=5):
    """Sustained float32 matmul FLOP/s of this process with ``threads`` BLAS threads.

    Each shape's rate is that of its fastest repeat (on a shared machine the others include
    time taken by other programs); the result is the median over the shapes.
    """
    import time

    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = []
    try:
        for m, k, n in sizes:
            a, b = torch.randn(m, k), torch.randn(k, n)
            a @ b  # warm up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start)
            rates.append(2 * m * k * n / min(times))  # the best run: least disturbed by others
    finally:
        torch.set_num_threads(before)
    return sorted(rates)[len(rates) // 2]


def elementwise_workloads(n=2 ** 20, parameters=2 ** 22):
    """({op: make}, {op: elements}): make() -> a function running the op forward and backward
    once on inputs of about ``n`` elements (4 MiB in float32, larger than this machine's caches
    per core, as a step's activations are), the way the model calls it (same functions, same
    shapes' last dimensions: H = 256, F = 1024, T = 128, head size 64, a vocabulary of 512);
    AdamW updates ``parameters`` elements (with its m and v, 64 MiB: an optimizer's state lives
    in memory, not in a cache)."""
    import torch
    import torch.nn.functional as F

    from tp_from_scratch.gpt.model import apply_rope, rope_tables
    H, T, hs = 256, 128, 64

    def leaf(*shape):
        return torch.randn(*shape, requires_grad=True)

    def fwd_bwd(f, *inputs):
        def run():
            out = f(*inputs)
            out.backward(torch.ones_like(out))
        return run

    def layernorm():
        x, w, b = leaf(n // H, H), leaf(H), leaf(H)
        return fwd_bwd(lambda x: F.layer_norm(x, (H,), w, b), x)

    def rmsnorm():
        x, w = leaf(n // H, H), leaf(H)
        return fwd_bwd(lambda x: F.rms_norm(x, (H,), w, 1e-6), x)

    def gelu():  # the exact (erf) form, the course's default; GPT-2's tanh form is priced alike
        return fwd_bwd(F.gelu, leaf(n // 1024, 1024))

    def swiglu():
        return fwd_bwd(lambda g, u: F.silu(g) * u, leaf(n // 1024, 1024), leaf(n // 1024, 1024))

    def rope():
        cos, sin = rope_tables(torch.arange(T), hs, 10000.0, torch.float32)
        return fwd_bwd(lambda x: apply_rope(x, cos, sin), leaf(n // (T * hs), 1, T, hs))

    def softmax():
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return fwd_bwd(lambda s: (s * hs ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1),
                       leaf(n // (T * T), T, T))

    def copy():
        return fwd_bwd(lambda y: y.transpose(1, 2).reshape(n // (T * hs) // 4, T, 4 * hs),
                       leaf(n // (T * hs) // 4, 4, T, hs))

    def add():
        x, y = torch.randn(n // H, H), torch.randn(n // H, H)
        return lambda: (x + y, y + x)  # the forward add, and the two gradients summed in backward

    def bias_grad():
        g = torch.randn(n // 1024, 1024)
        return lambda: g.sum(0)

    def cross_entropy():
        logits, targets = leaf(n // 512, 512), torch.randint(0, 512, (n // 512,))
        return lambda: F.cross_entropy(logits, targets).backward()

    def adamw():
        w = torch.nn.Parameter(torch.randn(parameters))
        w.grad = torch.randn(parameters)
        return torch.optim.AdamW([w], lr=1e-4, foreach=False).step

    makers = {f.__name__: f for f in (layernorm, rmsnorm, gelu, swiglu, rope, softmax, copy, add,
                                       bias_grad, cross_entropy, adamw)}
    return makers, {op: parameters if op == "adamw" else n for op in makers}


def measure_elementwise(threads, repeats=9):
    """{op: seconds per element} of each element-wise op of the model, forward + backward, this
    process with ``threads`` threads: the fastest of ``repeats`` runs (as for matmuls, the run
    least disturbed by other programs) on the inputs of elementwise_workloads."""
    import time

    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    workloads, elements = elementwise_workloads()
    out = {}
    try:
        for op, make in workloads.items():
            run = make()
            run()  # warm up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            out[op] = min(times) / elements[op]
    finally:
        torch.set_num_threads(before)
    return out


def measure_step_overhead(depths=(1, 4), repeats=15):
    """{"fixed_s", "per_layer_s"}: a training step's time that is not arithmetic, one thread.

    Times full steps (forward, backward, torch.optim's AdamW without foreach, as bench scaling
    runs them; the trainers' gpt/optim.py AdamW does the same arithmetic with less bookkeeping) of
    GPTs too small for their FLOPs to matter (H=16, T=4, B=1) at two depths, fastest of
    ``repeats`` each, and fits time = fixed + per_layer * L: the Python, autograd and optimizer
    bookkeeping that a FLOP count misses, and what dominates the smallest models.
    """
    import time

    import torch

    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    from tp_from_scratch.gpt.step import train_step
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seconds = []
    try:
        for layers in depths:
            config = GPTConfig(vocab_size=16, seq_len=4, n_layers=layers, hidden=16, n_heads=4, n_kv_heads=2)
            model = init_gpt(config, 0)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            x = torch.zeros(1, 4, dtype=torch.long)
            times = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                train_step(model, optimizer, x, x)   # Lesson 6's step
                times.append(time.perf_counter() - start)
            seconds.append(min(times[2:]))
    finally:
        torch.set_num_threads(before)
    fixed, per_layer = fit_line(list(depths), seconds)
    return {"fixed_s": max(fixed, 0.0), "per_layer_s": max(per_layer, 0.0)}


def lockstep_fit(call, barrier, p, repeats=5, iterations=10):
    """{"alpha_s", "beta_s_per_byte", "bytes", "seconds"} of the all-reduce ``call(x)`` (x a float32
    tensor) on p ranks, timed as a training step pays it; every rank calls this at once.

    In a step, every rank multiplies, then all-reduces, then multiplies again: a call starts
    when both ranks arrive, each arriving a little late or early (their matmuls do not take
    exactly as long), and a message moves only when the other process's thread gets a core,
    which the other rank's matmul is using. So each size is timed in lockstep: ``iterations`` x
    (a matmul of about a millisecond, then the all-reduce) against the same matmuls alone, both
    on every rank at once; the difference per iteration is what one call costs a step (the
    median of ``repeats``). A call timed alone after a barrier, on idle cores, costs about half.

    For a ring of p ranks, one all-reduce of n bytes takes 2(p-1) alpha + 2(p-1)/p n beta,
    so the fitted line time = a + b n gives alpha = a / (2(p-1)), beta = b p / (2(p-1)).
    """
    import statistics
    import time

    import torch
    sizes = [2 ** k for k in range(8, 21, 2)]  # float32 elements: 1 KiB .. 4 MiB
    a, b = torch.randn(256, 512), torch.randn(512, 512)  # 134 MFLOP: about a millisecond

    def lockstep(x, with_call):
        barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            a @ b
            if with_call:
                call(x)
        return time.perf_counter() - start

    seconds = []
    for n in sizes:
        x = torch.randn(n)
        lockstep(x, True)  # warm up
        per_call = [(lockstep(x, True) - lockstep(x, False)) / iterations for _ in range(repeats)]
        seconds.append(float(statistics.median(per_call)))
    intercept, slope = fit_line([4 * n for n in sizes], seconds)
    return {"alpha_s": max(intercept, 0.0) / ring_messages(p), "beta_s_per_byte": slope * p / (2 * (p - 1)),
            "bytes": [4 * n for n in sizes], "seconds": seconds}


def calibrate_worker(out_path):
    """Run under torchrun: gloo's native all-reduce and ours over TorchComm (lockstep_fit), and
    the matmul rate of one process while the others multiply too. Under mpiexec: our ring
    all-reduce over MPI's point-to-point messages (key "mpi")."""
    from tp_from_scratch.comm.launch import launcher_from_env
    if launcher_from_env() == "mpi":
        from tp_from_scratch.comm.mpi import MPIComm
        comm = MPIComm(timeout=120)
        try:
            result = {"mpi": lockstep_fit(ours(comm), comm.barrier, comm.world_size)}
        finally:
            comm.close()
        if comm.rank == 0:
            Path(out_path).write_text(json.dumps(result))
        return

    from tp_from_scratch.comm.launch import torch_main
    torch_main(lambda: measure_on_torch(out_path), timeout=120)


def ours(comm):
    """Our ring all-reduce on ``comm``, as lockstep_fit calls an all-reduce (a float32 tensor)."""
    from tp_from_scratch import collectives
    return lambda x: collectives.all_reduce(comm, x.numpy())


def measure_on_torch(out_path):
    """Under torchrun: the concurrent matmul rate and both all-reduces' fits; rank 0 writes them."""
    import torch.distributed as dist

    from tp_from_scratch.comm import TorchComm
    p, rank = dist.get_world_size(), dist.get_rank()
    comm = TorchComm()
    try:
        # every rank multiplies at once: the rate of one process while the other cores are busy too
        # (shared caches, memory bandwidth, clock); a step waits for the slowest, so keep the lowest
        dist.barrier()
        rates = [None] * p
        dist.all_gather_object(rates, measure_matmul_flops(1))
        result = {"matmul_flops_concurrent": {"1": min(rates), "processes": p},
                  "native": lockstep_fit(dist.all_reduce, dist.barrier, p),
                  "scratch": lockstep_fit(ours(comm), dist.barrier, p)}
    finally:
        comm.close()
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))


def calibrate(out_path, timeout=300, world_sizes=(2, 4)):
    """Measure matmul FLOP/s (1 and 2 threads; 1 thread on each of 2 processes at once), each
    element-wise op's seconds per element, the step overhead, and gloo all-reduce alpha, beta on
    2 processes (and on each other of ``world_sizes``)."""
    import os
    import statistics
    import tempfile

    from tp_from_scratch.comm.launchers import LauncherNotFoundError, mpiexec_command, run_command, torchrun_command
    # the matmul rate drifts by 10-20 % over minutes on a shared machine: three passes,
    # 1 and 2 threads in turn, and the median of each
    passes = [{k: measure_matmul_flops(k) for k in (1, 2)} for _ in range(3)]
    profile = {"source": "measured here by planner --calibrate", "cores": os.cpu_count(),
               "matmul_flops": {str(k): statistics.median(r[k] for r in passes) for k in (1, 2)},
               "elementwise_s_per_element": {str(k): measure_elementwise(k) for k in (1, 2)},
               "step_overhead": measure_step_overhead()}

    def worker(command, p):
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "all_reduce.json"
            out = run_command(command(p, "tp_from_scratch.cost.calibrate", "--worker", str(part)),
                              timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"the all-reduce calibration on {p} processes failed:\n{out.stdout[-3000:]}")
            return json.loads(part.read_text())

    for p in world_sizes:
        measured = worker(torchrun_command, p)
        concurrent = measured.pop("matmul_flops_concurrent")
        if p == 2:
            profile["matmul_flops_concurrent"], profile["all_reduce"] = concurrent, measured
        else:
            profile.setdefault("all_reduce_by_world_size", {})[str(p)] = measured
    try:  # our ring over MPI point-to-point, for bench scaling under mpiexec
        profile["all_reduce"].update(worker(mpiexec_command, 2))
    except LauncherNotFoundError as missing:
        print(f"no MPI fit: {missing}")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(profile, indent=1))
    return profile


def main(argv=None):
    """``--worker JSON``: the all-reduce fit of one launched process group (see calibrate)."""
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.cost.calibrate")
    parser.add_argument("--worker", metavar="JSON", required=True, help="where rank 0 writes the fit")
    calibrate_worker(parser.parse_args(argv).worker)


if __name__ == "__main__":
    main()
