"""The one place that decides whether a parallel result equals its single-device reference.

Tolerance policy (also in the README and Lesson 1):

* ``exact=True``: bit-for-bit equality. Use it where the parallel code performs the same
  floating-point operations in the same order as the reference: moving data (shard,
  unshard, all-gather, broadcast, all-to-all), element-wise functions applied to a shard,
  and max-reductions. Also for any computation on *integer-valued* float data: small
  integers add exactly in every order, so a sum split across ranks must reproduce the
  reference to the last bit, and even a wrong summation order cannot hide a bug.
* otherwise, a tight bound that only allows for a different *summation order*:

      max |got - expected|  <=  TOLERANCE[dtype] * max(1, max |expected|)

  A row-parallel matmul adds t partial sums instead of one long sum. Even a column split
  is not bit-exact in general: numpy hands a narrower block to a different BLAS kernel,
  which accumulates each dot product in another order (Lesson 1 measures it).
  The bound is relative to the largest magnitude in the reference, not element-wise:
  an element that cancels to ~0 still carries the rounding error of its large terms.
  The values are a few thousand units of roundoff for float64 and about a hundred for
  float32, enough for reordered sums of a few thousand terms and orders of magnitude
  below any real bug (a missing all-reduce or a doubled bias is off by O(1)).

Growth rule: depth and optimizer steps. ``tolerance(dtype, layers=L, steps=n)`` is the bound
for a result that went through L layers and n optimizer steps; tests take their bound from it,
never from a number one machine printed:

      tolerance  =  TOLERANCE[dtype] x max(1, L) x (1 + n)      [x lr / eps, see AdamW below]

* Depth, x L: every layer adds its own reordered-sum roundoff, and the residual stream carries
  the earlier layers' error on with a gain of about 1, so the error grows with the number of
  layers, not with their product.
* Steps, x (1 + n): each step's gradient carries the error of the forward and backward plus the
  error the weights already have; an SGD step adds lr times that to the weights (lr < 1), so the
  error grows linearly with the steps while training is not yet chaotic (tens of steps for this
  course's models; ``make demo`` shows a float32 run parting from one device later on).
  A loss or gradient computed after n steps is compared with ``steps=n``.
* AdamW, x lr / eps, for the *weights* only (``adamw_lr=``). AdamW's update is
  lr * m / (sqrt(v) + eps): it divides by the gradient's own size. On its first step it is
  lr * g / (|g| + eps), whose derivative in g is lr * eps / (|g| + eps)^2, largest at g = 0,
  where it is lr / eps (1e6 at lr = 1e-2 and torch's eps = 1e-8). So a roundoff error delta on a
  near-zero gradient entry moves that weight by up to lr * delta / eps. Measured in
  tests/test_sequence_parallel_torch.py (Llama, t = 4): blocks.0.attn.v.weight has an entry
  whose first gradient is 1.6e-9 (the tensor's largest is 0.026); it ends 2e-12 from the
  reference, twice the un-amplified bound. The loss and the gradients do not inherit this
  amplification to first order: the loss sees a weight's error only through g * delta_w, and
  lr * eps * |g| / (|g| + eps)^2 <= lr / 4. So weights after n AdamW steps get x lr / eps on
  top: loose in float64 (1e-12 x 2 x 4 x 1e6 = 8e-6 for two layers and three steps, still
  about 1000x below a wrong update, which is off by about lr), useless in float32 at eps = 1e-8:
  there compare training by its losses and gradients.

Finite differences (a backward checked against (f(x + h) - f(x - h)) / 2h) have their own
bound, ``finite_difference_tolerance(h, dtype)``: the truncation error is about h^2 and the
roundoff about eps_machine / h, with a margin of 1000 for the third derivative and the
function's scale.

Shapes and dtypes are compared exactly first: no broadcasting, no silent casts.
"""
import numpy as np

# dtype name -> relative bound for a changed summation order
TOLERANCE = {
    "float64": 1e-12,
    "float32": 1e-5,
    "float16": 1e-2,
    "bfloat16": 5e-2,
}


def dtype_name(dtype):
    """"float64" for "float64", np.float64, np.dtype("float64") or torch.float64."""
    if isinstance(dtype, str):
        return dtype
    name = str(dtype).replace("torch.", "")
    return name if name in TOLERANCE else np.dtype(dtype).name


def tolerance(dtype, *, layers=1, steps=0, adamw_lr=None, adamw_eps=1e-8):
    """The policy's relative bound for a result after `layers` layers and `steps` optimizer steps.

    TOLERANCE[dtype] x max(1, layers) x (1 + steps), and for weights after AdamW steps also
    x max(1, adamw_lr / adamw_eps): the growth rule argued in this module's docstring.
    dtype: a name ("float64"), a numpy or a torch dtype.
    """
    growth = max(1, layers) * (1 + steps)
    if adamw_lr is not None:
        growth *= max(1.0, adamw_lr / adamw_eps)
    return TOLERANCE[dtype_name(dtype)] * growth


def finite_difference_tolerance(h, dtype="float64"):
    """Bound for a central-difference gradient with step h: 1000 x (h^2 + eps_machine / h).

    The truncation error is about h^2 (times a third derivative / 6) and the roundoff about
    eps_machine x |f| / h; the factor 1000 covers both constants (a wrong backward is off by O(1)).
    """
    return 1000 * (h * h + float(np.finfo(dtype_name(dtype)).eps) / h)


def to_numpy(x):
    """(array, dtype name) for a numpy array, a number or a torch tensor on any device.

    bfloat16 has no numpy dtype: its values come back as float32, its name as "bfloat16".
    """
    if hasattr(x, "detach"):  # a torch tensor; torch is only touched if the caller has one
        t = x.detach().cpu()
        name = str(t.dtype).replace("torch.", "")
        return (t.float().numpy() if name == "bfloat16" else t.numpy()), name
    a = np.asarray(x)
    return a, a.dtype.name


def _where(name, rank):
    return f"{name}" if rank is None else f"{name} on rank {rank}"


def max_error(got, expected):
    """Largest absolute element-wise difference, as a Python float (0.0 for empty arrays)."""
    g, _ = to_numpy(got)
    e, _ = to_numpy(expected)
    if g.size == 0:
        return 0.0
    return float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64))))


def _scale(e):
    """max(1, max |expected|) over the finite entries: what the relative bound multiplies."""
    finite = np.isfinite(e)
    return max(1.0, float(np.max(np.abs(e[finite]))) if finite.any() else 1.0)


def allowed_error(expected, *, exact=False, tol=None):
    """The largest max |got - expected| the policy accepts: 0 if exact, else bound x scale."""
    e, edt = to_numpy(expected)
    if exact or not np.issubdtype(e.dtype, np.inexact):
        return 0.0
    return (TOLERANCE[edt] if tol is None else tol) * _scale(e)


def assert_matches_reference(got, expected, *, name="output", rank=None, exact=False, tol=None):
    """Assert that ``got`` equals the single-device ``expected`` under the tolerance policy.

    name, rank: printed in the failure message ("grad of fc.weight on rank 2 ...").
    exact:      demand bit-for-bit equality (same operations in the same order).
    tol:        the relative bound, default TOLERANCE[dtype] (one layer, no optimizer step); after
                several layers or optimizer steps pass tolerance(dtype, layers=..., steps=...).
    Works on numpy arrays and torch tensors (compared on the CPU).
    """
    where = _where(name, rank)
    g, gdt = to_numpy(got)
    e, edt = to_numpy(expected)
    if g.shape != e.shape:
        raise AssertionError(f"{where}: shape {g.shape} does not match the reference shape {e.shape}")
    if gdt != edt:
        raise AssertionError(f"{where}: dtype {gdt} does not match the reference dtype {edt}")
    if exact:
        # array_equal with equal_nan: bitwise for finite values, NaN where the reference has NaN
        if not np.array_equal(g, e, equal_nan=np.issubdtype(e.dtype, np.inexact)):
            raise AssertionError(
                f"{where}: not bit-exact; largest error {max_error(g, e):.3e} (tolerance 0, exact)"
            )
        return
    if not np.issubdtype(e.dtype, np.inexact):
        if not np.array_equal(g, e):
            raise AssertionError(f"{where}: integer values differ from the reference")
        return
    if not np.array_equal(np.isfinite(g), np.isfinite(e)):
        raise AssertionError(f"{where}: non-finite values (nan/inf) differ from the reference")
    bound = (TOLERANCE[edt] if tol is None else tol)
    finite = np.isfinite(e)
    scale = _scale(e)
    err = max_error(np.where(finite, g, 0), np.where(finite, e, 0))
    if err > bound * scale:
        raise AssertionError(
            f"{where}: largest error {err:.3e} exceeds the tolerance {bound:.1e} x scale {scale:.3g}"
            f" = {bound * scale:.3e} ({edt})"
        )


def assert_all_match(got: dict, expected: dict, *, rank=None, exact=False, tol=None):
    """assert_matches_reference for every entry of two dicts with the same keys (e.g. gradients)."""
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise AssertionError(f"rank {rank}: missing entries {missing}, unexpected entries {extra}")
    for key in expected:
        assert_matches_reference(got[key], expected[key], name=key, rank=rank, exact=exact, tol=tol)
