"""Losses and the evaluation metrics that go with them.

A loss is any function

  loss(outputs [B, ...], targets [B, ...], mask [B] bool) -> scalar

that averages over the rows where mask is True (0 when none are): the padding
of a short minibatch is masked, never dropped, so the function sees fixed
shapes under jit. A metric is a function

  metric(outputs [B, ...], targets [B, ...]) -> [B] per-example values

that evaluation averages over the real test examples. A `Task` bundles a
training loss with its metrics and the dtype its targets must have, so that
the store, the minibatches and the evaluation keep, for example, regression
targets as float32 end to end:

  classification()   softmax cross-entropy on integer labels [B] (int32);
                     metrics accuracy and loss (metrics.jsonl: test_accuracy, test_loss)
  regression("mse")  mean squared error on float32 targets [B] or [B, k]; metrics mse,
                     mae and loss (test_mse, test_mae, test_loss); "mae": the same with
                     the mean absolute error as the training loss
  from_loss(fn)      any loss of the form above; its metric is the loss itself
  next_token(...)    per-token softmax cross-entropy of a language model: outputs
                     [B, T, V] logits, targets [B, T] int32 token ids with padding;
                     metrics accuracy and loss over the tokens, not the sequences
                     (test_accuracy, test_loss; perplexity is exp(test_loss))

A metric may instead return a pair (sums [B], counts [B]): evaluation then
divides the sums over the test set by the counts over it (a per-token mean over
all the test set's tokens, as the sequence benchmarks report it).

Regression outputs [B, 1] against targets [B] (a one-output model) are compared
as [B]; any other shape mismatch is an error before training starts.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import ConfigError

Loss = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
Metric = Callable[[jax.Array, jax.Array], jax.Array]
TARGET_DTYPES = ("int32", "float32")


class Task(NamedTuple):
  """A training loss, its evaluation metrics and the targets it takes.

  metrics: name -> per-example metric, in the order metrics.jsonl lists them as
  test_<name>; 'loss' is the loss itself per example (every built-in task has it).
  target_dtype: 'int32' (class labels), 'float32' (real targets) or None (the
  data's own: integer targets as int32, real ones as float32).
  sequence: targets [B, T] and outputs [B, T, ...] per token (next_token).
  builtin: a built-in task's description with its arguments (its identity in the
  run's digests, stable across JAX versions, where is_builtin); '' for your own.
  token_ids: the token ids a sequence task names (pad, ...): each must be below the
  model's vocabulary."""
  name: str
  loss: Loss
  metrics: Mapping[str, Metric]
  target_dtype: str | None = None
  sequence: bool = False
  builtin: str = ""
  token_ids: tuple[int, ...] = ()   # the ids a sequence task names (below the vocabulary)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of values [B] over the rows where mask [B] is True (0 when none are)."""
  m = mask.astype(values.dtype)
  return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)


# ---------------------------------------------------------------------------- classification


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy: logits [B, K], labels [B] int -> [B]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example 1.0 where argmax(logits) == label, else 0.0: [B]."""
  return (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean cross-entropy over the rows where mask is True (0 when none are).

  logits [B, K], labels [B] int, mask [B] bool.
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  m = mask.astype(ce.dtype)
  return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)


# ---------------------------------------------------------------------------- regression


def _as_targets(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  """outputs in the targets' shape: [B, 1] against [B] is one output per example."""
  if outputs.shape == targets.shape:
    return outputs
  if outputs.shape[0] == targets.shape[0] and outputs.size == targets.size:
    return outputs.reshape(targets.shape)
  raise ValueError(f"regression outputs of shape {tuple(outputs.shape)} do not match targets "
                   f"of shape {tuple(targets.shape)}: the model needs one output per target")


def _per_example(err: jax.Array) -> jax.Array:
  """[B, ...] -> [B]: the mean over each example's target coordinates."""
  return err.reshape(err.shape[0], -1).mean(axis=1) if err.ndim > 1 else err


def squared_error(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example squared error (mean over a target's coordinates): [B]."""
  return _per_example(jnp.square(_as_targets(outputs, targets) - targets))


def absolute_error(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example absolute error (mean over a target's coordinates): [B]."""
  return _per_example(jnp.abs(_as_targets(outputs, targets) - targets))


def mse(outputs: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean squared error over the rows where mask is True (0 when none are)."""
  return masked_mean(squared_error(outputs, targets), mask)


def mae(outputs: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean absolute error over the rows where mask is True (0 when none are)."""
  return masked_mean(absolute_error(outputs, targets), mask)


# ---------------------------------------------------------------------------- sequences


def _token_mask(targets: jax.Array, masked: tuple[int, ...]) -> jax.Array:
  """[B, T] bool: the tokens whose target is none of `masked`."""
  keep = jnp.ones(targets.shape, bool)
  for t in masked:
    keep = keep & (targets != t)
  return keep


def _token_ids(name: str, ids) -> tuple[int, ...]:
  """ids as a tuple of token ids, or ConfigError (one line)."""
  if not isinstance(ids, (tuple, list)) or not all(
      isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
    raise ConfigError(f"next_token {name} = {ids!r}: allowed are a tuple of token ids "
                      "(ints >= 0)")
  return tuple(ids)


_NEXT_TOKEN: dict[str, Task] = {}   # one Task a setting: is_builtin tells them from copies


def next_token(pad: int = 0, not_scored: tuple[int, ...] = (),
               never_predicted: tuple[int, ...] = ()) -> Task:
  """A language model's next-token task: outputs [B, T, V] logits, targets [B, T]
  int32 (the ids the inputs shifted by one; `pad` after a sequence's end).

  loss: the softmax cross-entropy averaged over the batch's non-pad target tokens
  of the unmasked rows. Metrics, each a mean over the test set's tokens:
  'accuracy' over the targets that are neither pad nor in `not_scored` (e.g. EOS),
  with the ids in `never_predicted` (e.g. pad, BOS, EOS, OOV) never the prediction,
  so an out-of-vocabulary target counts as a miss (FedJAX's accuracy_in_vocab);
  'loss' the cross-entropy over the non-pad targets (perplexity: exp(test_loss)).
  Every id named must be below the model's vocabulary (the set-up checks)."""
  if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
    raise ConfigError(f"next_token pad = {pad!r}: allowed is a token id (an int >= 0)")
  not_scored = _token_ids("not_scored", not_scored)
  never_predicted = _token_ids("never_predicted", never_predicted)
  described = (f"next_token(pad={pad}, not_scored={not_scored}, "
               f"never_predicted={never_predicted})")
  if described not in _NEXT_TOKEN:
    _NEXT_TOKEN[described] = _next_token_task(pad, not_scored, never_predicted, described)
  return _NEXT_TOKEN[described]


def _next_token_task(pad: int, not_scored: tuple[int, ...], never_predicted: tuple[int, ...],
                     described: str) -> Task:
  def loss(logits, targets, mask):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)   # [B, T]
    m = (_token_mask(targets, (pad,)) & mask[:, None]).astype(ce.dtype)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)

  def token_loss(logits, targets):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    m = _token_mask(targets, (pad,)).astype(ce.dtype)
    return jnp.sum(ce * m, -1), jnp.sum(m, -1)

  def token_accuracy(logits, targets):
    if never_predicted:
      logits = logits.at[..., jnp.asarray(never_predicted)].set(-jnp.inf)
    hit = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    m = _token_mask(targets, (pad,) + not_scored).astype(jnp.float32)
    return jnp.sum(hit * m, -1), jnp.sum(m, -1)
  return Task("next_token", loss, {"accuracy": token_accuracy, "loss": token_loss}, "int32",
              sequence=True, builtin=described,
              token_ids=tuple(sorted({pad, *not_scored, *never_predicted})))


def is_builtin(task: Task) -> bool:
  """Whether `task` is a built-in one (a name's, or next_token's for its setting), not
  a copy with another loss or metrics (Task._replace keeps `builtin`)."""
  return (any(task is t for t in NAMES.values())
          or (bool(task.builtin) and _NEXT_TOKEN.get(task.builtin) is task))


# ---------------------------------------------------------------------------- tasks


CLASSIFICATION = Task("classification", masked_cross_entropy,
                      {"accuracy": accuracy, "loss": cross_entropy}, "int32")
REGRESSION_MSE = Task("regression", mse,
                      {"mse": squared_error, "mae": absolute_error, "loss": squared_error},
                      "float32")
REGRESSION_MAE = Task("regression_mae", mae,
                      {"mse": squared_error, "mae": absolute_error, "loss": absolute_error},
                      "float32")
NAMES = {"classification": CLASSIFICATION, "cross_entropy": CLASSIFICATION,
         "regression": REGRESSION_MSE, "mse": REGRESSION_MSE, "mae": REGRESSION_MAE}


def classification() -> Task:
  """Softmax cross-entropy on int32 labels; metrics accuracy and loss."""
  return CLASSIFICATION


def regression(loss: str = "mse") -> Task:
  """Regression on float32 targets [N] or [N, k]: loss 'mse' or 'mae'; metrics mse, mae, loss."""
  if loss not in ("mse", "mae"):
    raise ConfigError(f"regression loss {loss!r}: allowed are mse, mae")
  return REGRESSION_MSE if loss == "mse" else REGRESSION_MAE


def from_loss(fn: Loss, *, name: str | None = None, target_dtype: str | None = None) -> Task:
  """A Task around any loss(outputs, targets, mask) -> scalar mean over the masked rows.

  Its one metric, 'loss', is fn on each example alone (so the test loss is the
  mean of fn over the test set, as a loss that averages over rows gives)."""
  if target_dtype not in (None,) + TARGET_DTYPES:
    raise ConfigError(f"target_dtype {target_dtype!r}: allowed are int32, float32, or None")

  def per_example(outputs, targets):
    one = jnp.ones((1,), bool)
    return jax.vmap(lambda o, t: fn(o[None], t[None], one))(outputs, targets)
  return Task(name or getattr(fn, "__name__", "custom"), fn, {"loss": per_example},
              target_dtype)


def get(loss) -> Task:
  """A Task from a name (classification, cross_entropy, regression, mse, mae), a Task,
  or a loss function; None is classification. ConfigError (one line) otherwise."""
  if loss is None:
    return CLASSIFICATION
  if isinstance(loss, Task):
    if not loss.metrics or loss.target_dtype not in (None,) + TARGET_DTYPES:
      raise ConfigError(f"loss Task {loss.name!r}: needs at least one metric and target_dtype "
                       f"int32, float32 or None (got {loss.target_dtype!r})")
    return loss
  if isinstance(loss, str):
    if loss not in NAMES:
      raise ConfigError(f"loss {loss!r}: allowed are {', '.join(NAMES)}, a losses.Task, or a "
                       "function (outputs, targets, mask) -> scalar")
    return NAMES[loss]
  if callable(loss):
    return from_loss(loss)
  raise ConfigError(f"loss of type {type(loss).__name__}: allowed are {', '.join(NAMES)}, a "
                    "losses.Task, or a function (outputs, targets, mask) -> scalar")
