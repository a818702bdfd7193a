"""The analyzer's semantic branch: a compressed network over feature descriptors.

The dynamic-DP paper (section 3.2.2) classifies data into three sensitivity
classes (high, medium, low) with a small network distilled from a larger one:

  teacher   d -> 256 -> 256 -> 3 (ReLU), trained on labelled descriptors
  student   d -> 128 (ReLU, 70 % of the weights magnitude-pruned)
              -> 64 (ReLU, dropout 0.3 while training) -> 3 (softmax)
  distillation   loss = alpha CE(student, y) + (1 - alpha) T^2 KL(teacher_T || student_T),
                 T = 3, alpha = 0.3 (the T^2 keeps the soft term's gradient scale)
  pruning        after distillation, the 70 % smallest |W1| are set to zero and the
                 rest fine-tuned with the same loss (the mask held fixed)
  quantization   post-training, weight-only int8: each weight column w_j is stored
                 as round(w_j / s_j) in [-127, 127] with s_j = max|w_j| / 127, biases
                 stay float32; the forward pass dequantizes

The input is one feature's descriptor on one client's data
(`analyzer.feature_descriptors`); the output, P(high), P(medium), P(low).
All functions are pure and jittable; training loops are `lax.scan`s.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

TEACHER_HIDDEN = (256, 256)
STUDENT_HIDDEN = (128, 64)
NUM_CLASSES = 3   # high, medium, low (tabular.TIERS[:3])


def init_mlp(key: jax.Array, sizes: tuple[int, ...]) -> list[tuple[jax.Array, jax.Array]]:
  """He-initialized layers [(W [in, out], b [out])] for layer sizes (in, h1, ..., out)."""
  keys = jax.random.split(key, len(sizes) - 1)
  return [(jax.random.normal(k, (a, b)) * math.sqrt(2.0 / a), jnp.zeros((b,)))
          for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def mlp_logits(params, x: jax.Array, dropout_key: jax.Array | None = None,
               dropout: float = 0.0, dropout_layer: int = 1) -> jax.Array:
  """x [n, d] -> logits [n, classes]; inverted dropout after hidden layer
  `dropout_layer` (0-based) when a key is given."""
  for i, (w, b) in enumerate(params):
    x = x @ w + b
    if i < len(params) - 1:
      x = jax.nn.relu(x)
      if dropout_key is not None and dropout > 0 and i == dropout_layer:
        keep = jax.random.bernoulli(dropout_key, 1.0 - dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - dropout), 0.0)
  return x


def _fit(loss_fn, params, key, x, steps: int, batch: int, lr: float):
  """Adam on minibatches drawn with replacement; returns the fitted params."""
  opt = optax.adam(lr)

  def step(carry, k):
    p, s = carry
    kb, kd = jax.random.split(k)
    idx = jax.random.randint(kb, (batch,), 0, x.shape[0])
    g = jax.grad(loss_fn)(p, idx, kd)
    u, s = opt.update(g, s, p)
    return (optax.apply_updates(p, u), s), None

  (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), jax.random.split(key, steps))
  return params


def train_teacher(key: jax.Array, x: jax.Array, y: jax.Array, steps: int = 1500,
                  batch: int = 512, lr: float = 1e-3):
  """The teacher: cross-entropy on descriptors x [n, d] with classes y [n]."""
  params = init_mlp(jax.random.fold_in(key, 0), (x.shape[1],) + TEACHER_HIDDEN + (NUM_CLASSES,))

  def loss(p, idx, _):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(mlp_logits(p, x[idx]), y[idx]))
  return _fit(loss, params, jax.random.fold_in(key, 1), x, steps, batch, lr)


def distillation_loss(student_logits: jax.Array, teacher_logits: jax.Array, y: jax.Array,
                      temperature: float = 3.0, alpha: float = 0.3) -> jax.Array:
  """alpha CE(student, y) + (1 - alpha) T^2 KL(softmax(teacher / T) || softmax(student / T))."""
  ce = optax.softmax_cross_entropy_with_integer_labels(student_logits, y)
  pt = jax.nn.softmax(teacher_logits / temperature)
  log_ps = jax.nn.log_softmax(student_logits / temperature)
  kl = jnp.sum(pt * (jnp.log(jnp.maximum(pt, 1e-30)) - log_ps), axis=-1)
  return jnp.mean(alpha * ce + (1.0 - alpha) * temperature ** 2 * kl)


def magnitude_mask(w: jax.Array, sparsity: float) -> jax.Array:
  """bool mask of w keeping the (1 - sparsity) largest |w| (ties kept)."""
  k = int(round(sparsity * w.size))
  if k == 0:
    return jnp.ones(w.shape, bool)
  cut = jnp.sort(jnp.abs(w).reshape(-1))[k - 1]
  return jnp.abs(w) > cut


class Student(NamedTuple):
  params: list            # [(W, b)] float32, W1 already multiplied by its mask
  mask: jax.Array         # bool [d, 128]: the first layer's kept weights


def distill_student(key: jax.Array, teacher, x: jax.Array, y: jax.Array,
                    temperature: float = 3.0, alpha: float = 0.3, dropout: float = 0.3,
                    sparsity: float = 0.7, steps: int = 1500, finetune_steps: int = 500,
                    batch: int = 512, lr: float = 1e-3) -> Student:
  """Distills the student from `teacher`, prunes W1 to `sparsity`, fine-tunes."""
  teacher_logits = mlp_logits(teacher, x)
  params = init_mlp(jax.random.fold_in(key, 0), (x.shape[1],) + STUDENT_HIDDEN + (NUM_CLASSES,))

  def make_loss(mask):
    def loss(p, idx, kd):
      if mask is not None:
        p = [(p[0][0] * mask, p[0][1])] + list(p[1:])
      logits = mlp_logits(p, x[idx], kd, dropout)
      return distillation_loss(logits, teacher_logits[idx], y[idx], temperature, alpha)
    return loss

  params = _fit(make_loss(None), params, jax.random.fold_in(key, 1), x, steps, batch, lr)
  mask = magnitude_mask(params[0][0], sparsity)
  params = _fit(make_loss(mask), params, jax.random.fold_in(key, 2), x, finetune_steps, batch,
                lr)
  params = [(params[0][0] * mask, params[0][1])] + list(params[1:])
  return Student(params, mask)


class QuantizedMLP(NamedTuple):
  weights: list    # int8 [in, out] per layer
  scales: list     # float32 [out] per layer
  biases: list     # float32 [out] per layer


def quantize_int8(params) -> QuantizedMLP:
  """Weight-only symmetric int8, one scale per output column."""
  ws, ss, bs = [], [], []
  for w, b in params:
    s = jnp.maximum(jnp.max(jnp.abs(w), axis=0), 1e-12) / 127.0
    ws.append(jnp.clip(jnp.round(w / s), -127, 127).astype(jnp.int8))
    ss.append(s.astype(jnp.float32))
    bs.append(jnp.asarray(b, jnp.float32))
  return QuantizedMLP(ws, ss, bs)


def quantized_logits(q: QuantizedMLP, x: jax.Array) -> jax.Array:
  """The int8 student's forward pass (weights dequantized per column)."""
  n = len(q.weights)
  for i, (w, s, b) in enumerate(zip(q.weights, q.scales, q.biases)):
    x = (x @ w.astype(jnp.float32)) * s + b
    if i < n - 1:
      x = jax.nn.relu(x)
  return x


def param_bytes(tree) -> int:
  """Bytes of every array in a pytree, at its dtype."""
  return int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree)))


def sparse_bytes(q: QuantizedMLP, mask: np.ndarray) -> int:
  """Bytes of the int8 student with W1 stored sparse (kept values, int8, plus a
  d x 128 bitmap) and the rest dense."""
  mask = np.asarray(mask)
  first = int(mask.sum()) + math.ceil(mask.size / 8)
  rest = sum(np.asarray(w).nbytes for w in q.weights[1:])
  return first + rest + param_bytes(q.scales) + param_bytes(q.biases)
