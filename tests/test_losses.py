"""Losses, metrics and real-valued targets end to end, against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.training import client as client_lib
from fedjax_dp import losses
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import Model
from fedjax_dp.core.evaluate import batch_for_eval, make_evaluate
from fedjax_dp.placement.store import build_store


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(7, 4)).astype(np.float32)
  labels = rng.integers(0, 4, size=7).astype(np.int32)
  pred = rng.normal(size=(7, 3)).astype(np.float32)
  target = rng.normal(size=(7, 3)).astype(np.float32)
  mask = np.array([1, 1, 0, 1, 0, 1, 1], bool)
  return logits, labels, pred, target, mask


def test_classification_loss_and_metrics_against_numpy(batch):
  logits, labels, _, _, mask = batch
  ce = -_np_log_softmax(logits.astype(np.float64))[np.arange(7), labels]
  np.testing.assert_allclose(losses.cross_entropy(logits, labels), ce, rtol=1e-6)
  np.testing.assert_allclose(losses.masked_cross_entropy(logits, labels, mask), ce[mask].mean(),
                             rtol=1e-6)
  np.testing.assert_array_equal(losses.accuracy(logits, labels),
                                (logits.argmax(-1) == labels).astype(np.float32))


def test_regression_losses_against_numpy(batch):
  _, _, pred, target, mask = batch
  err = pred.astype(np.float64) - target
  np.testing.assert_allclose(losses.mse(pred, target, mask), (err ** 2).mean(1)[mask].mean(),
                             rtol=1e-6)
  np.testing.assert_allclose(losses.mae(pred, target, mask), np.abs(err).mean(1)[mask].mean(),
                             rtol=1e-6)
  # one output per example, [B, 1] against targets [B]
  np.testing.assert_allclose(losses.mse(pred[:, :1], target[:, 0], mask),
                             (err[:, 0] ** 2)[mask].mean(), rtol=1e-6)
  # no real row: 0, not NaN
  none = np.zeros(7, bool)
  assert float(losses.mse(pred, target, none)) == 0.0 == float(losses.mae(pred, target, none))
  with pytest.raises(ValueError, match=r"outputs of shape \(7, 2\) do not match targets"):
    losses.mse(pred[:, :2], target, mask)


def test_from_loss_metric_is_the_loss_on_each_example(batch):
  _, _, pred, target, mask = batch
  def huber(o, t, m):
    e = jnp.abs(o - t).mean(-1)
    h = jnp.where(e < 0.5, 0.5 * e ** 2, 0.5 * (e - 0.25))
    return losses.masked_mean(h, m)
  task = losses.from_loss(huber, target_dtype="float32")
  assert task.name == "huber" and list(task.metrics) == ["loss"]
  per = np.asarray(task.metrics["loss"](pred, target))
  assert per.shape == (7,)
  np.testing.assert_allclose(per[mask].mean(), huber(pred, target, mask), rtol=1e-6)


def test_get_names_tasks_and_refusals():
  assert losses.get(None) is losses.CLASSIFICATION == losses.get("classification")
  assert losses.get("mse") is losses.REGRESSION_MSE and losses.get("mae").loss is losses.mae
  assert losses.get(losses.REGRESSION_MAE) is losses.REGRESSION_MAE
  assert losses.get(losses.mse).name == "mse" and losses.get(losses.mse).target_dtype is None
  for bad, msg in (("hinge", "loss 'hinge': allowed are classification"),
                   (3, "loss of type int: allowed are"),
                   (losses.Task("t", losses.mse, {}, "float32"), "needs at least one metric")):
    with pytest.raises(ConfigError, match=msg) as e:
      losses.get(bad)
    assert "\n" not in str(e.value)


def _linear_model(d, k):
  """y = x @ W + b as a Model; params {'w': [d, k], 'b': [k]}."""
  return Model(init=lambda key: {"w": jax.random.normal(key, (d, k)) * 0.3,
                                 "b": jnp.full((k,), 0.1)},
               apply=lambda p, x: x.reshape(x.shape[0], -1) @ p["w"] + p["b"], name="linear")


@pytest.mark.parametrize("target_shape", [(), (2,)])
def test_evaluate_gives_the_tasks_metrics_over_padded_batches(target_shape):
  """Regression metrics over a test set that does not fill its last batch, against numpy;
  the targets hold fractions, so a cast to int would change every metric."""
  rng = np.random.default_rng(1)
  k = target_shape[0] if target_shape else 1
  x = rng.normal(size=(23, 5)).astype(np.float32)
  y = (rng.normal(size=(23,) + target_shape) + 0.5).astype(np.float32)
  model = _linear_model(5, k)
  params = model.init(jax.random.PRNGKey(0))
  data = batch_for_eval(x, y, 10)
  assert data[1].dtype == jnp.float32 and data[1].shape == (3, 10) + target_shape
  got = make_evaluate(model, losses.REGRESSION_MSE)(params, *data)
  pred = (x.astype(np.float64) @ np.asarray(params["w"], np.float64)
          + np.asarray(params["b"])).reshape((23,) + target_shape)
  err = (pred - y).reshape(23, -1)
  np.testing.assert_allclose(got["mse"], (err ** 2).mean(1).mean(), rtol=1e-5)
  np.testing.assert_allclose(got["mae"], np.abs(err).mean(1).mean(), rtol=1e-5)
  assert float(got["loss"]) == float(got["mse"])


def test_evaluate_classification_accuracy_and_loss_against_numpy():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(31, 6)).astype(np.float32)
  y = rng.integers(0, 3, size=31).astype(np.int32)
  model = _linear_model(6, 3)
  params = model.init(jax.random.PRNGKey(3))
  got = make_evaluate(model)(params, *batch_for_eval(x, y, 8))
  logits = x.astype(np.float64) @ np.asarray(params["w"], np.float64) + np.asarray(params["b"])
  assert list(got) == ["accuracy", "loss"]
  np.testing.assert_allclose(got["accuracy"], np.mean(logits.argmax(-1) == y), rtol=1e-7)
  np.testing.assert_allclose(got["loss"], -_np_log_softmax(logits)[np.arange(31), y].mean(),
                             rtol=1e-5)


def test_store_keeps_real_targets_real_and_labels_int():
  parts = [np.array([0, 2]), np.array([1, 3, 4])]
  y = np.array([0.25, 1.5, -2.75, 3.125, 0.5])
  store = build_store(np.zeros((5, 2)), y, parts, pad_to_multiple=4)
  assert store.y.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(store.y), y.astype(np.float32))
  labels = build_store(np.zeros((5, 2)), np.array([0, 1, 2, 1, 0]), parts)
  assert labels.y.dtype == jnp.int32
  # the task's dtype wins over the data's
  assert build_store(np.zeros((5, 2)), y, parts, y_dtype="float32").y.dtype == jnp.float32


def test_local_train_with_mse_is_a_full_batch_gradient_step():
  """One full-batch step (batch >= n, one epoch, no momentum) of the MSE of a linear
  model: w - lr * (2/n) X^T (X w + b - y), b - lr * (2/n) sum(X w + b - y)."""
  rng = np.random.default_rng(4)
  x = rng.normal(size=(9, 3)).astype(np.float32)
  y = (rng.normal(size=9) * 2 + 0.3).astype(np.float32)
  model = _linear_model(3, 1)
  params = model.init(jax.random.PRNGKey(5))
  row = jnp.asarray(np.r_[np.arange(6), np.zeros(2, int)], jnp.int32)   # rows 0..5, padded
  res = client_lib.local_train(params, row, jnp.int32(6), jax.random.PRNGKey(6), 0.1,
                               apply_fn=model.apply, x=jnp.asarray(x), y=jnp.asarray(y),
                               epochs=1, batch_size=8, momentum=0.0, loss=losses.mse)
  w, b = np.asarray(params["w"], np.float64), np.asarray(params["b"], np.float64)
  r = (x[:6] @ w + b)[:, 0] - y[:6]
  np.testing.assert_allclose(res.delta["w"], -0.1 * (2 / 6) * (x[:6].T @ r)[:, None], atol=1e-6)
  np.testing.assert_allclose(res.delta["b"], [-0.1 * (2 / 6) * r.sum()], atol=1e-6)
  np.testing.assert_allclose(res.loss_sum, 6 * np.mean(r ** 2), rtol=1e-5)
  assert int(res.steps) == 1
