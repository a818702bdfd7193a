"""Per-client clipping without a per-client loop, where every client takes one step.

Under the one-step condition (core/one_step.py) client i's update is
delta_i = -lr g_i, g_i the gradient of its mean loss at the global model. A DP
mechanism's clip (privacy/clip_layout.clip_update: flat, per layer or per tier)
scales each part p of it by

  s_ip = min(1, C_p / (lr ||g_ip||)),

so the clipped sum is sum_i w_i s_i delta_i = -lr sum_i w_i s_i g_i, a
reweighted gradient: it needs each client's part norms, not its gradient.

  dense layers (nn.Dense of the built-in models): the norms from each client's
    inputs and output gradients (core/layer_taps.py: Gram matrices of its rows),
    and the reweighted sum as one matmul over the cohort's rows;
  every other leaf (convolutions; every leaf of a custom model, whose dense
    kernels might be read elsewhere too): per-client gradients, vmapped over a
    chunk of clients.

One forward and one backward pass over the cohort in chunks of clients: the
numbers of the per-client loop (clip, then the weighted sum) up to float
summation order. An update whose norm is not finite is sent as zero, as
clip_update sends it.

Local DP's report noise is not drawn here: where no stage reads a single report
the round draws the sum of the cohort's independent Gaussians as one Gaussian of
the summed variance (core/client_phase.py), for which this returns
sum_i (w_i f_i)^2 (f_i: each client's noise factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.core import layer_taps
from fedjax_dp.placement.executor import map_in_batches
from fedjax_dp.privacy.clip_layout import ClipLayout
from fedjax_dp.training.client import LocalResult


def train_cohort_clipped(loss_fn, params, rows, counts, took_part, factor, lr, x, y, chunk: int,
                         *, clip_norm, layout: ClipLayout, uniform: bool, tap_dense: bool):
  """(LocalResult [local] without delta, sum_i w_i clip(delta_i), each slot's
  norm before the clip [local], sum_i (w_i factor_i)^2) for this device's slots.

  rows [local, width] int32, counts [local], took_part [local] bool, factor
  [local] float32 (local DP's per-client noise factor; ones otherwise), lr: the
  round's client learning rate, chunk: clients per chunk; w_i = took_part
  (uniform) or counts; tap_dense: dense layers by their taps (the built-in
  models), else every leaf per client."""
  width = rows.shape[1]
  positions = jnp.arange(width)
  leaves, treedef = jax.tree.flatten(params)
  mask0 = positions < 1
  calls = (layer_taps.dense_calls(lambda p, r, m: loss_fn(p, x[r], y[r], m), params, rows[0],
                                  mask0) if tap_dense else ())
  owned = layer_taps.dense_leaves(params, calls)
  rest = [i for i in range(len(leaves)) if i not in owned]

  def client_grads(r, m):
    def loss(rest_leaves, taps):
      full = list(leaves)
      for i, v in zip(rest, rest_leaves):
        full[i] = v
      (objective, data_loss), inputs = layer_taps.tapped(loss_fn, taps)(
          jax.tree.unflatten(treedef, full), x[r], y[r], m)
      return objective, (data_loss, inputs)
    # zeros_like a leaf: varying over the device axis as the params are (an invariant
    # tap's gradient would be summed over the devices: JAX_NOTES.md)
    taps = [jnp.zeros_like(leaves[0], shape=c.out_shape, dtype=c.out_dtype) for c in calls]
    (g_rest, e), (data_loss, a) = jax.grad(loss, argnums=(0, 1), has_aux=True)(
        [leaves[i] for i in rest], taps)
    return g_rest, e, data_loss, a

  def chunk_step(carry, part):
    grad_sum, report_var = carry
    r, n, took, f = part
    g_rest, e, data_loss, a = jax.vmap(client_grads)(r, positions[None, :] < n[:, None])
    grads = _leaf_factors(leaves, owned, rest, calls, g_rest, a, e)
    w = (took if uniform else n).astype(jnp.float32)
    summed, total = clipped_sum(grads, w, jnp.abs(lr), clip_norm, layout)
    grad_sum = [s + t for s, t in zip(grad_sum, summed)]
    report_var = report_var + jnp.sum(jnp.square(w * f))
    return (grad_sum, report_var), (data_loss * n.astype(jnp.float32), total)

  zero = ([jnp.zeros_like(v) for v in leaves], jnp.zeros_like(leaves[0], shape=()))
  (loss_sums, norms), (grad_sum, report_var) = map_in_batches(
      chunk_step, zero, (rows, counts, took_part, factor), chunk)
  delta_sum = jax.tree.unflatten(treedef, [-lr * g for g in grad_sum])
  res = LocalResult(delta=(), loss_sum=loss_sums, examples=counts.astype(jnp.float32),
                    steps=(counts > 0).astype(jnp.int32))
  return res, delta_sum, norms, report_var


def clipped_sum(grads: list, w: jax.Array, scale, clip_norm, layout: ClipLayout):
  """(each leaf's sum_i w_i clip(scale g_i) / scale, each client's norm of scale g_i
  [chunk]): the per-client loop's clip of the updates scale g_i (clip_update's
  rule: per part, not finite sent as zero), from the leaves' factors (_leaf_factors).

  The clip divides by a norm raised by bounds on its rounding errors: a dense
  kernel's Gram norm (layer_taps.kernel_sq_norms) and the distance between the
  vector the norm is of and the one summed here (computed apart: rows u T). Where a
  client's examples' gradients cancel, the Gram norm alone could be far below what
  is added, and the clip would not bound it; elsewhere the bounds are about 1e-5 of
  the norm (the loop's clip factor to that). The norms returned (the unclipped
  count's) are the plain ones."""
  sq, slack, lin = _part_sq_norms(grads, layout)                       # [chunk, parts]
  norms = scale * jnp.sqrt(sq)
  total = jnp.sqrt(jnp.sum(jnp.square(norms), axis=1))                 # [chunk]
  finite = jnp.isfinite(total)
  bounds = clip_norm * jnp.asarray(layout.fractions, jnp.float32)
  upper = scale * (jnp.sqrt(sq + slack) + lin)
  factor = jnp.minimum(1.0, bounds / jnp.maximum(upper, 1e-30))
  weight = jnp.where(finite[:, None], factor * w[:, None], 0.0)       # [chunk, parts]
  return weighted_sum(grads, weight, finite, layout, layer_taps.HIGHEST), total


def _leaf_factors(leaves, owned, rest, calls, g_rest, a, e) -> list:
  """Each leaf's per-client gradient as ('grad', [chunk, *leaf]) or, for a dense
  layer's leaf, ('kernel', a, e) / ('bias', e) with a, e [chunk, rows, features]."""
  out = [None] * len(leaves)
  for i, g in zip(rest, g_rest):
    out[i] = ("grad", g)
  for i, (path, kind) in owned.items():
    e_rows = layer_taps.rows_of(calls, e, path)
    out[i] = (("kernel", layer_taps.rows_of(calls, a, path), e_rows) if kind == "kernel"
              else ("bias", e_rows))
  return out


def _leaf_sq(grad, by_row: bool) -> tuple:
  """([chunk] squared norms of a leaf's per-client gradients, or [chunk, rows]; a
  bound on their rounding error; on the distance to the vector weighted_sum adds)."""
  if grad[0] == "kernel":
    sq, slack = layer_taps.kernel_sq_norms(grad[1], grad[2], by_row)
    lin = (grad[1].shape[1] * layer_taps.UNIT_ROUNDOFF
           * layer_taps.kernel_abs_sum(grad[1], grad[2], by_row))
    return sq, slack, lin
  # a bias's and a per-client gradient's sums are the vectors weighted_sum adds
  g = jnp.sum(grad[1], axis=1) if grad[0] == "bias" else grad[1]
  sq = jnp.square(g).reshape(g.shape[0], g.shape[1] if by_row else 1, -1)
  sq = jnp.sum(sq, axis=2) if by_row else jnp.sum(sq, axis=(1, 2))
  return sq, jnp.zeros_like(sq), jnp.zeros_like(sq)


def _part_sq_norms(grads: list, layout: ClipLayout) -> tuple:
  """([chunk, parts] each client's squared gradient norm in each clip part, the
  bounds on its rounding error (squared) and on the summed vector's distance)."""
  parts = len(layout.fractions)
  totals = [0.0, 0.0, 0.0]
  for grad, part in zip(grads, layout.part_of_leaf):
    if isinstance(part, tuple):   # a leaf split by rows (sensitivity tiers)
      onehot = jax.nn.one_hot(jnp.asarray(part, jnp.int32), parts, dtype=jnp.float32)
      values = [v @ onehot for v in _leaf_sq(grad, True)]
    else:
      values = [v[:, None] * jax.nn.one_hot(part, parts) for v in _leaf_sq(grad, False)]
    totals = [t + v for t, v in zip(totals, values)]
  return tuple(totals)


def weighted_sum(grads: list, weight: jax.Array, finite: jax.Array, layout: ClipLayout,
                 precision=None) -> list:
  """Each leaf's sum_i weight_ip g_i (weight [chunk, parts], p the leaf's part); a
  client whose norm is not `finite` adds zero (selected, not multiplied: 0 * inf is
  NaN; None: no client is selected out); precision: the kernels' products' (a
  clip's: float32, as its norm's; None: the round's matmul precision)."""
  out = []
  ok = (lambda v: v) if finite is None else (
      lambda v: jnp.where(finite.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0))
  for grad, part in zip(grads, layout.part_of_leaf):
    w = weight[:, jnp.asarray(part, jnp.int32)] if isinstance(part, tuple) else weight[:, part]
    if grad[0] == "kernel" and w.ndim == 2:   # a weight per kernel row (input feature)
      out.append(jnp.einsum("cri,cro->io", ok(grad[1]) * w[:, None, :], ok(grad[2]),
                            precision=precision))
    elif grad[0] == "kernel":   # the weight on the narrower output side: a [chunk, rows,
      # in] scaled by it cost a copy of the widest factor (the FMNIST MLP's 784 inputs)
      out.append(jnp.einsum("cri,cro->io", ok(grad[1]), ok(grad[2]) * w[:, None, None],
                            precision=precision))
    elif grad[0] == "bias":
      e = jnp.sum(ok(grad[1]), axis=1)                                   # [chunk, out]
      out.append(jnp.sum(e * (w if w.ndim == 2 else w[:, None]), axis=0))
    else:
      g = ok(grad[1])
      w = w.reshape(w.shape + (1,) * (g.ndim - w.ndim))
      out.append(jnp.sum(g * w, axis=0))
  return out
