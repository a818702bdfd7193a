"""Evaluation of a model on the test set, and of SOLO's per-client models."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp import losses
from fedjax_dp.models import Model
from fedjax_dp.placement.store import target_dtype


def make_solo_evaluate(model: Model, precision: str = "float32") -> Callable:
  """SOLO's accuracy: the mean over clients of each client's own model's accuracy on
  the test set, reweighted to the client's label distribution,
    acc_i = sum_k p_ik correct_ik / n_k,
  (and the same for the loss). client_models: leaves [N, ...]; label_dist [N, K]."""
  @jax.jit
  @jax.default_matmul_precision(precision)
  def evaluate(client_models, xb, yb, mb, label_dist):
    num_classes = label_dist.shape[1]
    onehot = jax.nn.one_hot(yb, num_classes) * mb[..., None]         # [nb, b, K]
    per_class_n = jnp.maximum(jnp.sum(onehot, axis=(0, 1)), 1.0)      # [K]

    def one_client(args):
      p, dist = args
      def batch(a):
        x, y, oh = a
        logits = model.apply(p, x)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        correct = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
        return correct @ oh, ce @ oh                                   # [K], [K]
      correct, loss = jax.lax.map(batch, (xb, yb, onehot))
      return (dist @ (jnp.sum(correct, 0) / per_class_n),
              dist @ (jnp.sum(loss, 0) / per_class_n))
    acc, loss = jax.lax.map(one_client, (client_models, label_dist))
    return jnp.mean(acc), jnp.mean(loss)
  return evaluate


def make_evaluate(model: Model, task: losses.Task | None = None,
                  precision: str = "float32") -> Callable:
  """(params, x [nb, b, ...], y [nb, b, ...], mask [nb, b]) -> {name: mean over the
  real test examples} for each of the task's metrics (classification: accuracy, loss);
  a metric that returns (sums, counts) per example: its sums over the real test
  examples over their counts (next_token's per-token means).
  precision: the matrix products' (config key matmul_precision)."""
  metrics = tuple((task or losses.CLASSIFICATION).metrics.items())
  # 'loss' computed first: for classification this is the program evaluation
  # always compiled to, so the test metrics of earlier runs stay bit for bit
  order = sorted(metrics, key=lambda kv: kv[0] != "loss")

  @jax.jit
  @jax.default_matmul_precision(precision)
  def evaluate(params, xb, yb, mb):
    def one(args):
      x, y, m = args
      outputs = model.apply(params, x)
      values = [fn(outputs, y) for _, fn in order]
      mf = m.astype(jnp.float32)
      # a metric's pair (sums [b], counts [b]): both summed, divided at the end
      return tuple((jnp.sum(v[0] * mf), jnp.sum(v[1] * mf)) if isinstance(v, tuple)
                   else jnp.sum(v * mf) for v in values)
    sums = dict(zip((name for name, _ in order), jax.lax.map(one, (xb, yb, mb))))
    n = jnp.maximum(jnp.sum(mb), 1)
    return {name: (jnp.sum(sums[name][0]) / jnp.maximum(jnp.sum(sums[name][1]), 1.0)
                   if isinstance(sums[name], tuple) else jnp.sum(sums[name]) / n)
            for name, _ in metrics}

  def evaluate_floats(params, xb, yb, mb) -> dict[str, float]:
    # Python floats in the task's order (a jitted dict comes back sorted, as arrays):
    # what a user prints and compares; float32 -> float is exact. Traced (under jit or
    # vmap) it returns the arrays, as any JAX function does
    values = evaluate(params, xb, yb, mb)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((params, xb))):
      return {name: values[name] for name, _ in metrics}
    values = jax.device_get(values)
    return {name: float(values[name]) for name, _ in metrics}
  return evaluate_floats


def batch_for_eval(x: np.ndarray, y: np.ndarray, batch: int, y_dtype: str | None = None):
  """Pads a test set to whole batches: x [nb, b, ...], y [nb, b, ...], mask [nb, b].

  y keeps its kind (store.target_dtype: int32 labels, float32 real targets)
  unless y_dtype says otherwise."""
  n = len(y)
  b = min(batch, max(n, 1))
  nb = max(1, math.ceil(n / b))
  pad = nb * b - n
  xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]).reshape((nb, b) + x.shape[1:])
  yp = np.concatenate([y, np.zeros((pad,) + y.shape[1:], y.dtype)]).reshape((nb, b) + y.shape[1:])
  mp = (np.arange(nb * b) < n).reshape(nb, b)
  return (jnp.asarray(xp, jnp.float32), jnp.asarray(yp, target_dtype(y, y_dtype)),
          jnp.asarray(mp))
