"""Many small local steps as low-rank updates of the one shared model.

Where a client takes K small SGD steps (batches of B) from the global model and
every parameter is a dense layer's, its layer after s steps differs from the
shared one by a low-rank term:

  W_is = W - lr sum_{u<=s} c_su a_u^T e_u,    b_is = b - lr sum_{u<=s} c_su sum_rows e_u,

a_u [B, in] the layer's inputs at step u, e_u [B, out] its output gradients, c_su
the momentum trace's weight of step u's gradient after s steps (optax.sgd:
trace_s = g_s + beta trace_{s-1}, so c_su = sum_{t=u..s} beta^(t-u)). Client i's
layer at step s + 1 is then

  x W_is + b_is = (x W + b) - lr ((x A^T) c) E - lr c E,   A, E: its earlier rows,

the cohort's rows against the shared W in one matmul (the one-step path's regime,
core/one_step.py) plus a rank-sB correction per client; its update and the
cohort's weighted (or clipped) sum are sums over rows of (c a)^T e, one matmul
over the cohort's rows. No client holds a model copy. A step costs the shared
forward and backward plus O(B s B (in + out)) a layer for the corrections.

The steps are local training's (training/client.local_train): its epoch orders
from the client's key, batch positions and masks, E ceil(n_i / B) steps a
client, optax.sgd's momentum trace; so the numbers are the per-client loop's to
float summation order. `why_not` says where the path does not apply.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from fedjax_dp.core import layer_taps
from fedjax_dp.core.one_step_clipped import clipped_sum, weighted_sum
from fedjax_dp.placement.executor import map_in_batches
from fedjax_dp.privacy.clip_layout import ClipLayout
from fedjax_dp.training.client import LocalResult, epoch_orders

MAX_STEPS = 64          # steps a client, unrolled in the program
CORRECTION_SHARE = 0.5  # the corrections' matmul work at most this share of the shared one's


def num_steps(width: int, epochs: int, batch_size: int) -> int:
  """The most steps a client of `width` example slots takes (local_train's bound)."""
  return epochs * -(-width // batch_size)


def why_not(apply, params, x_one, *, width: int, epochs: int, batch_size: int,
            cost: bool = True) -> str:
  """'' where the cohort's steps can run as low-rank updates, else why not: every
  leaf a dense layer's (called once a forward, on [batch, in] rows), at most
  MAX_STEPS steps, and where `cost` (auto's choice) the corrections' work (K B rows
  against each layer's in + out) at most CORRECTION_SHARE of the shared layers'
  (in out). x_one: one example, [1, ...]."""
  steps = num_steps(width, epochs, batch_size)
  if steps > MAX_STEPS:
    return f"a client takes up to {steps} local steps, more than {MAX_STEPS}"
  calls = layer_taps.dense_calls(apply, params, x_one)
  owned = layer_taps.dense_leaves(params, calls)
  if len(owned) != len(jax.tree.leaves(params)) or len({c.path for c in calls}) != len(calls):
    return "the model has parameters outside dense layers called once a forward"
  if any(len(c.in_shape) != 2 for c in calls):
    return "a dense layer runs on more than [batch, features] rows"
  rows = steps * batch_size
  correction = sum(rows * (c.in_shape[1] + c.out_shape[1]) for c in calls)
  shared = sum(c.in_shape[1] * c.out_shape[1] for c in calls)
  if cost and correction > CORRECTION_SHARE * shared:
    return (f"{steps} steps of {batch_size} examples: the low-rank corrections would cost "
            f"{correction / shared:.2f} of the shared matmuls (at most {CORRECTION_SHARE})")
  return ""


def train_cohort_steps(loss_fn, params, rows, counts, keys, took_part, factor, lr, momentum, x,
                       y, chunk: int, *, epochs: int, batch_size: int, uniform: bool,
                       clip_norm=None, layout: ClipLayout | None = None):
  """(LocalResult [local] without delta, the weighted sum of the deltas, each
  slot's delta norm [local] (clipped) or (), sum_i (w_i factor_i)^2) for this
  device's slots, w_i = took_part (uniform) or counts.

  rows [local, max_n] int32: each slot's full store row (local_train's orders
  depend on its width); counts, took_part, factor [local]; keys [local]: each
  client's training key; momentum: the client optimizer's (None: none);
  clip_norm, layout: each delta clipped first (a DP mechanism's clip), else the
  example-weighted sum."""
  width = rows.shape[1]
  steps = num_steps(width, epochs, batch_size)
  beta = jnp.zeros((), jnp.float32) if momentum is None else jnp.asarray(momentum, jnp.float32)
  leaves, treedef = jax.tree.flatten(params)
  calls = layer_taps.dense_calls(lambda p, r, m: loss_fn(p, x[r], y[r], m), params,
                                 rows[0, :batch_size], jnp.arange(batch_size) < 1)
  owned = layer_taps.dense_leaves(params, calls)
  flat = layout or ClipLayout((0,) * len(leaves), (1.0,), ("all",))

  def client(row, count, key):
    return _client_rows(loss_fn, params, calls, row, count, key, lr, beta, x, y, steps=steps,
                        epochs=epochs, batch_size=batch_size, like=leaves[0])

  def chunk_step(carry, part):
    grad_sum, report_var = carry
    r, n, k, took, f = part
    (a, e, coef, examples, e_examples), loss_sum, total = jax.vmap(client)(r, n, k)
    grads = [None] * len(leaves)
    for i, (path, kind) in owned.items():
      j = next(j for j, c in enumerate(calls) if c.path == path)
      # the row weights c on the output gradients (the narrower side, usually); the
      # first layer's kernel from each example once (its rows summed over epochs)
      grads[i] = (("kernel", examples, e_examples) if kind == "kernel" and j == 0 else
                  ("kernel", a[j], e[j] * coef[..., None]) if kind == "kernel"
                  else ("bias", e[j] * coef[..., None]))
    w = (took if uniform else n).astype(jnp.float32)
    if clip_norm is None:
      summed, norms = weighted_sum(grads, w[:, None], None, flat), ()
    else:
      summed, norms = clipped_sum(grads, w, jnp.abs(lr), clip_norm, flat)
    grad_sum = [s + t for s, t in zip(grad_sum, summed)]
    report_var = report_var + jnp.sum(jnp.square(w * f))
    return (grad_sum, report_var), (loss_sum, total, norms)

  zero = ([jnp.zeros_like(v) for v in leaves], jnp.zeros_like(leaves[0], shape=()))
  (loss_sums, totals, norms), (grad_sum, report_var) = map_in_batches(
      chunk_step, zero, (rows, counts, keys, took_part, factor), chunk)
  delta_sum = jax.tree.unflatten(treedef, [-lr * g for g in grad_sum])
  res = LocalResult(delta=(), loss_sum=loss_sums, examples=(epochs * counts).astype(jnp.float32),
                    steps=totals)
  return res, delta_sum, norms, report_var


def _client_rows(loss_fn, params, calls, row, count, key, lr, beta, x, y, *, steps: int,
                 epochs: int, batch_size: int, like):
  """One client's local training as rows: ((per dense call: inputs [K B, in] (the
  first call's none, [0, in]: its inputs are the examples), output gradients
  [K B, out]), each row's weight c in the final update [K B], the examples
  [max_n, in] and their output gradients at the first layer summed over the
  epochs with their c [max_n, out]), its loss sum and step count. The final update
  of a layer is -lr sum_r c_r a_r^T e_r (bias: -lr sum_r c_r e_r)."""
  b = batch_size
  orders = epoch_orders(key, count, row.shape[0], epochs)
  # the first layer's input is the example itself (the MLP flattens it): its product
  # with the shared kernel is the same in every epoch, so it is taken once an example
  first = params
  for name in calls[0].path:
    first = first[name]
  examples = x[row].reshape(row.shape[0], -1)                       # [max_n, in]
  shared_first = examples @ first["kernel"] + first["bias"]         # [max_n, out]
  # and its corrections' products of a batch with the earlier rows are the examples'
  # own: one [max_n, max_n] Gram matrix, no row of the input kept
  gram = examples @ examples.T
  positions = []
  per_epoch = (count + b - 1) // b
  total = epochs * per_epoch
  # each call's rows, written step by step (in place: a concatenation per step copied
  # the earlier rows again)
  a_rows = [jnp.zeros_like(like, shape=(steps * b if k else 0, c.in_shape[-1]))
            for k, c in enumerate(calls)]
  e_rows = [jnp.zeros_like(like, shape=(steps * b, c.out_shape[-1])) for c in calls]
  trace = jnp.zeros((steps,), jnp.float32)    # the momentum trace's weight of each step
  coef = jnp.zeros((steps,), jnp.float32)     # the model's: the traces' sum
  loss_sum = jnp.zeros_like(like, shape=())
  for s in range(steps):
    epoch = s // jnp.maximum(per_epoch, 1)
    start = (s - epoch * per_epoch) * b
    pos = jax.lax.dynamic_slice(orders[jnp.minimum(epoch, epochs - 1)], (start,), (b,))
    mask = start + jnp.arange(b) < count
    active = s < total
    c_rows = jnp.repeat(coef[:s], b)                                      # [s B]
    earlier = [(a_rows[k][:s * b], e_rows[k][:s * b]) if s else None
               for k in range(len(calls))]
    if s:   # the first layer's x a^T from the Gram matrix
      earlier[0] = (gram[pos][:, jnp.concatenate(positions)], earlier[0][1])
    positions.append(pos)
    e_now, value, a_now = _step_gradients(loss_fn, params, calls, earlier, c_rows, lr,
                                          x[row[pos]], y[row[pos]], mask, like,
                                          shared_first[pos])
    for k in range(len(calls)):   # a step not taken adds nothing: its e rows are zero
      if k:                       # (and its c: the steps taken come first)
        a_rows[k] = a_rows[k].at[s * b:(s + 1) * b].set(a_now[k])
      e_rows[k] = e_rows[k].at[s * b:(s + 1) * b].set(jnp.where(active, e_now[k], 0))
    new_trace = (beta * trace).at[s].set(1.0)
    trace = jnp.where(active, new_trace, trace)
    coef = jnp.where(active, coef + new_trace, coef)
    loss_sum = loss_sum + jnp.where(active, value * jnp.sum(mask), 0.0)
  c_rows = jnp.repeat(coef, b)
  e_examples = jnp.zeros_like(shared_first).at[jnp.concatenate(positions)].add(
      e_rows[0] * c_rows[:, None])                                    # [max_n, out]
  return (a_rows, e_rows, c_rows, examples, e_examples), loss_sum, total.astype(jnp.int32)


def _step_gradients(loss_fn, params, calls, earlier, c_rows, lr, xb, yb, mb, like, first_out):
  """One step at the client's current model (the shared one plus its earlier rows'
  corrections): each dense call's output gradient [B, out], the data loss, and
  each call's input [B, in]. first_out: the first layer's shared output for the
  batch (x W + b, taken once an example)."""
  def loss(taps):
    inputs = []

    def corrected(module, xin, call):
      k = len(inputs)
      inputs.append(xin)
      out = (first_out if k == 0 else call()) + taps[k]
      if earlier[k] is not None:   # the first layer's x a^T given (a Gram matrix's rows)
        a, e = earlier[k]
        xa = a if k == 0 else xin @ a.T
        out = out - lr * (xa * c_rows + c_rows) @ e
      return out
    with layer_taps.intercept_dense(corrected):
      objective, data_loss = loss_fn(params, xb, yb, mb)
    return objective, (data_loss, inputs)

  # zeros_like a leaf: varying over the device axis as the params are (JAX_NOTES.md)
  zeros = [jnp.zeros_like(like, shape=(xb.shape[0], c.out_shape[-1]), dtype=c.out_dtype)
           for c in calls]
  grads, (value, inputs) = jax.grad(loss, has_aux=True)(zeros)
  return grads, value, inputs
