"""Each dense layer's inputs and output gradients, per client: what per-client
gradient norms and clipped sums need without per-client gradients.

A dense layer y = a W + b seen by one client's rows j (its examples, times
positions where the layer runs per position) has the client's gradient

  dW = sum_j a_j^T e_j,    db = sum_j e_j,    e_j = dL/dy_j,

so ||dW||^2 = sum_{j,k} (a_j . a_k)(e_j . e_k): two [rows, rows] Gram matrices
instead of the [in, out] gradient ("ghost clipping": Goodfellow 2015; Lee and
Kifer 2021; Li et al. 2022), and the clients' clipped sum is one matmul
(c a)^T e, each row scaled by its client's clip factor c.

`tapped(fn, taps)` runs `fn` with every flax `nn.Dense` call recorded: its input
kept, and a zero tap added to its output, whose gradient is e. `dense_calls`
finds the calls (their paths in the params and shapes) by tracing once.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class DenseCall(NamedTuple):
  """One nn.Dense call of a forward pass, for one client."""
  path: tuple[str, ...]   # the module's path in the params (its kernel and bias under it)
  in_shape: tuple         # its input's shape, [..., in]
  out_shape: tuple        # its output's shape, [..., out]
  out_dtype: object       # its output's dtype (the tap's)


@contextlib.contextmanager
def intercept_dense(on_call):
  """Within: each nn.Dense __call__ goes through on_call(module, x, call) -> output."""
  def interceptor(next_fun, args, kwargs, ctx):
    if type(ctx.module) is not nn.Dense or ctx.method_name != "__call__" or kwargs:
      return next_fun(*args, **kwargs)
    return on_call(ctx.module, args[0], lambda: next_fun(*args))
  with nn.intercept_methods(interceptor):
    yield


def dense_calls(fn, *args) -> tuple[DenseCall, ...]:
  """The nn.Dense calls fn(*args) makes, in order (traced abstractly, no compute)."""
  calls = []

  def record(module, x, call):
    out = call()
    calls.append(DenseCall(tuple(module.path), tuple(x.shape), tuple(out.shape), out.dtype))
    return out
  with intercept_dense(record):
    jax.eval_shape(fn, *args)
  return tuple(calls)


def tapped(fn, taps: list):
  """fn(*args) -> (fn's value, [each Dense call's input]), with taps[i] added to
  call i's output (zeros: the value is fn's; the gradient with respect to taps[i]
  is that output's gradient)."""
  def run(*args):
    if not taps:
      return fn(*args), []
    inputs = []

    def add_tap(module, x, call):
      out = call() + taps[len(inputs)]
      inputs.append(x)
      return out
    with intercept_dense(add_tap):
      value = fn(*args)
    if len(inputs) != len(taps):
      raise ValueError(f"the model made {len(inputs)} dense calls, not the {len(taps)} traced")
    return value, inputs
  return run


def dense_leaves(params, calls: tuple[DenseCall, ...]) -> dict[int, tuple]:
  """{leaf index (jax.tree.leaves order): (path, 'kernel' | 'bias')} for the leaves
  the Dense calls own; every other leaf is differentiated per client."""
  paths = {c.path for c in calls}
  out = {}
  for i, (keypath, _) in enumerate(jax.tree_util.tree_flatten_with_path(params)[0]):
    names = tuple(str(getattr(k, "key", k)) for k in keypath)
    if names[:-1] in paths and names[-1] in ("kernel", "bias"):
      out[i] = (names[:-1], names[-1])
  return out


def rows_of(calls: tuple[DenseCall, ...], values: list, path: tuple) -> jax.Array:
  """[clients, rows, features]: every call of the layer at `path` (inputs or
  output gradients, each [clients, ..., features]), rows concatenated."""
  parts = [v.reshape(v.shape[0], -1, v.shape[-1]) for c, v in zip(calls, values)
           if c.path == path]
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


HIGHEST = jax.lax.Precision.HIGHEST   # float32 products whatever the round's matmul
                                      # precision (TF32 would loosen the clip's bound)
UNIT_ROUNDOFF = 2.0 ** -24            # float32's


def kernel_sq_norms(a: jax.Array, e: jax.Array, by_row: bool):
  """(each client's ||sum_j a_j^T e_j||^2, a bound on its rounding error): [clients],
  or by kernel row (input feature; [clients, in]) where by_row. a [clients, rows, in],
  e [clients, rows, out].

  From the Gram matrices where rows^2 < in * out, else from the gradient itself. The
  Gram route sums rows^2 products that cancel where the examples' gradients do: its
  error is about (sqrt(in) + sqrt(out) + rows) u T^2, T = sum_j |a_j| |e_j| (u
  float32's unit roundoff, times 4), which can pass the norm itself (and made it
  negative: clamped at 0). The bound lets the clip use a norm that is never below
  the true one (one_step_clipped.clipped_sum); the gradient route's is 0."""
  rows, d_in, d_out = a.shape[1], a.shape[2], e.shape[2]
  if rows * rows >= d_in * d_out:
    g = jnp.einsum("cri,cro->cio", a, e, precision=HIGHEST)
    sq = jnp.sum(jnp.square(g), axis=2) if by_row else jnp.sum(jnp.square(g), axis=(1, 2))
    return sq, jnp.zeros_like(sq)
  ee = jnp.einsum("cjo,cko->cjk", e, e, precision=HIGHEST)
  if by_row:
    sq = jnp.einsum("cji,cki,cjk->ci", a, a, ee, precision=HIGHEST)
  else:
    sq = jnp.einsum("cjk,cjk->c", jnp.einsum("cji,cki->cjk", a, a, precision=HIGHEST), ee,
                    precision=HIGHEST)
  error = 4 * (d_in ** 0.5 + d_out ** 0.5 + rows) * UNIT_ROUNDOFF
  return jnp.maximum(sq, 0.0), error * jnp.square(kernel_abs_sum(a, e, by_row))


def kernel_abs_sum(a: jax.Array, e: jax.Array, by_row: bool) -> jax.Array:
  """T = sum_j |a_j| |e_j| ([clients]; by_row: sum_j |a_jf| |e_j|, [clients, in]):
  the triangle inequality's bound on ||sum_j a_j^T e_j||, and the scale of its
  rounding errors."""
  e_norms = jnp.sqrt(jnp.sum(jnp.square(e), axis=2))                  # [clients, rows]
  if by_row:
    return jnp.einsum("cri,cr->ci", jnp.abs(a), e_norms, precision=HIGHEST)
  return jnp.sum(jnp.sqrt(jnp.sum(jnp.square(a), axis=2)) * e_norms, axis=1)
