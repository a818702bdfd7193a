"""The cohort as one batch: clients whose whole local work is one step.

In the cross-device regime a client holds a handful of examples: with E = 1
and every client's n_i <= B, client i takes exactly one SGD step from the
global model w,

  delta_i = -lr * grad L_i(w),    L_i = the mean loss over i's examples,

(optax.sgd with momentum: the trace starts at zero, so the first step is the
plain gradient step). The FedAvg sum the server needs is then linear in the
gradients, and the gradient is linear in the clients:

  sum_i n_i delta_i = -lr * grad_w [ sum_i n_i L_i(w) ],

one forward and one backward pass over the cohort's examples. The clients are
vmapped with the parameters unbatched, so each layer is one [clients * n, in]
x [in, out] matmul (jax folds the client axis into the rows) and each client's
loss is still computed on its own batch, as local training computes it. The
per-client loop's fixed cost (about 200 us a client on CPU) and the
[clients, d] model copies of a vmapped loop are gone.

The executor (placement/executor.py) picks this path only where it gives the
per-client loop's numbers up to float summation order: no per-client state,
no local terms, no upload stage, nothing that reads uploads one by one (DP,
attacks, robust rules), the example-weighted sum. Each example's row is the
client's first `width` positions (width = the largest client), not a batch of
B: the padding rows are masked out of the loss either way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.placement.executor import map_in_batches
from fedjax_dp.training.client import LocalResult


def train_cohort_one_step(loss_fn, params, rows: jax.Array, counts: jax.Array, lr: jax.Array,
                          x: jax.Array, y: jax.Array, chunk: int):
  """(per-client LocalResult [local] without delta and params, sum_i n_i delta_i)
  for this device's slots: loss_sum L_i * n_i, examples n_i, steps 1 where the
  client has examples (local training's values for one step).

  loss_fn(p, xb, yb, mb) -> (objective, data loss): one client's batch loss;
  rows [local, width] int32: each slot's example indices (padding after
  counts[i]); counts [local] (0 for a slot that does not take part); lr: this
  round's client learning rate; chunk: clients per chunk of the scan."""
  width = rows.shape[1]
  positions = jnp.arange(width)

  def chunk_step(grad_sum, part):
    r, n = part
    mask = positions[None, :] < n[:, None]                      # [chunk, width]

    def weighted(p):
      objective, data_loss = jax.vmap(lambda ri, mi: loss_fn(p, x[ri], y[ri], mi))(r, mask)
      n_f = n.astype(jnp.float32)
      return jnp.sum(n_f * objective), data_loss * n_f

    grad, loss_sums = jax.grad(weighted, has_aux=True)(params)
    return jax.tree.map(jnp.add, grad_sum, grad), loss_sums

  loss_sums, grad_sum = map_in_batches(chunk_step, jax.tree.map(jnp.zeros_like, params),
                                       (rows, counts), chunk)
  delta_sum = jax.tree.map(lambda g: -lr * g, grad_sum)
  res = LocalResult(delta=(), loss_sum=loss_sums, examples=counts.astype(jnp.float32),
                    steps=(counts > 0).astype(jnp.int32))
  return res, delta_sum


def one_step_width(*, epochs: int, batch_size: int, client_count, local_terms: tuple[str, ...],
                   upload_stages: bool, per_client_state: bool, inspects_uploads: bool,
                   uniform_weights: bool) -> tuple[int, str]:
  """(the largest client's example count, '') where the one-step path gives the
  per-client loop's numbers (see the module docstring), else (0, why not).
  client_count [num_clients]: the store's counts (host); local_terms: the
  objective's term names; upload_stages: the recipe has upload stages."""
  largest = int(max(int(c) for c in client_count)) if len(client_count) else 0
  why = ("local_epochs is not 1" if epochs != 1 else
         f"a client holds {largest} examples, more than batch_size {batch_size}"
         if largest > batch_size else
         plain_sgd_why(local_terms=local_terms, upload_stages=upload_stages,
                       per_client_state=per_client_state, inspects_uploads=inspects_uploads,
                       uniform_weights=uniform_weights))
  return (0 if why else max(largest, 1)), why


def plain_sgd_why(*, local_terms: tuple[str, ...], upload_stages: bool, per_client_state: bool,
                  inspects_uploads: bool, uniform_weights: bool) -> str:
  """'' where each client's local work is plain SGD on the task loss whose upload
  only the (example-weighted, or clipped) sum reads, else why not: the cohort's
  paths (one_step, low_rank) need it."""
  return (f"the local terms {', '.join(local_terms)} change the step" if local_terms else
          "an upload stage (clip, top-k, noise) transforms each upload" if upload_stages else
          "a stage keeps per-client state" if per_client_state else
          "a stage reads each upload (an attack, a robust rule, or local DP's per-report "
          "noise draw)" if inspects_uploads else
          "shuffled uploads are weighted uniformly" if uniform_weights else "")
