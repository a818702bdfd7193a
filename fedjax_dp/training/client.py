"""Local training of one client: E epochs of minibatch SGD through optax.

Client i with n_i examples runs E * ceil(n_i / B) steps. Each epoch visits its
examples in a fresh random order (drawn from the client's own key); the last
batch of an epoch may be short and its loss is the mean over its real
examples, as a PyTorch loop with `drop_last=False` does. The step count is a
traced value, so on the sequential client path a small client costs only its
own steps; under `vmap` the loop runs to the cohort's longest client and the
finished clients' state is held unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.losses import masked_cross_entropy  # noqa: F401  (its home was here)


class LocalResult(NamedTuple):
  delta: dict          # w_i^{t+1} - w^t, same pytree as params
  loss_sum: jax.Array  # sum over steps of (mean batch loss * batch examples)
  examples: jax.Array  # number of example-visits (E * n_i), float32
  steps: jax.Array     # number of local optimizer steps K = E * ceil(n_i / B), int32
  params: Any = ()     # w_i^{t+1} itself (w^t + delta rounds differently); () once dropped


def epoch_orders(key: jax.Array, count: jax.Array, max_n: int, epochs: int) -> jax.Array:
  """[epochs, max_n] positions into the client's row: a random order of the
  first `count` positions, followed by the padding positions."""
  def one(k):
    u = jax.random.uniform(k, (max_n,))
    u = jnp.where(jnp.arange(max_n) < count, u, 2.0)  # padding sorts last
    return jnp.argsort(u).astype(jnp.int32)
  return jax.vmap(one)(jax.random.split(key, epochs))


def local_train(params, index_row: jax.Array, count: jax.Array, key: jax.Array, lr: jax.Array, *,
                apply_fn: Callable, x: jax.Array, y: jax.Array, epochs: int, batch_size: int,
                momentum, loss_fn: Callable | None = None,
                loss: Callable = masked_cross_entropy) -> LocalResult:
  """Trains from `params` on one client's data and returns the model delta.

  index_row [max_n] int32 indices into x/y; count: n_i (0 for an empty slot,
  which then returns a zero delta); lr: this round's learning rate.
  x [N, ...], y [N, ...]: the store's examples and targets (int32 labels or float32).
  loss_fn(p, xb, yb, mb) -> (objective, data loss): the local objective (see
  objectives.py); default: `loss`(apply_fn(p, xb), yb, mb) alone, the task's
  loss (losses.py; default the masked cross-entropy).
  """
  max_n = index_row.shape[0]  # a multiple of batch_size: every slice stays in the row
  steps_per_epoch = (count + batch_size - 1) // batch_size
  total_steps = epochs * steps_per_epoch
  orders = epoch_orders(key, count, max_n, epochs)
  # momentum may be a traced array (hyperparameters as data); None or 0 turns it off
  if momentum is not None and not isinstance(momentum, jax.Array) and momentum <= 0:
    momentum = None
  opt = optax.sgd(learning_rate=lr, momentum=momentum)

  if loss_fn is None:
    def loss_fn(p, xb, yb, mb):
      value = loss(apply_fn(p, xb), yb, mb)
      return value, value

  def step(s, carry):
    p, opt_state, loss_sum = carry
    epoch = s // jnp.maximum(steps_per_epoch, 1)
    start = (s - epoch * steps_per_epoch) * batch_size
    pos = jax.lax.dynamic_slice(orders[jnp.minimum(epoch, epochs - 1)], (start,), (batch_size,))
    mask = start + jnp.arange(batch_size) < count
    ex = index_row[pos]
    (_, value), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, x[ex], y[ex], mask)
    updates, opt_state = opt.update(grads, opt_state, p)
    p = optax.apply_updates(p, updates)
    return p, opt_state, loss_sum + value * jnp.sum(mask)

  # zeros_like(count) keeps the loss accumulator as device-varying as the
  # client it belongs to (required inside shard_map).
  carry = (params, opt.init(params), jnp.zeros_like(count, jnp.float32))
  new_params, _, loss_sum = jax.lax.fori_loop(0, total_steps, step, carry)
  delta = jax.tree.map(jnp.subtract, new_params, params)
  return LocalResult(delta, loss_sum, (epochs * count).astype(jnp.float32),
                     total_steps.astype(jnp.int32), new_params)
