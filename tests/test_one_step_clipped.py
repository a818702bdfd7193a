"""Per-client clipping without a per-client loop (core/one_step_clipped.py,
core/layer_taps.py) and local DP's reports' noise drawn once for their sum: the
per-client loop's numbers to float summation order, the noise's distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core import layer_taps
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import make_model
from tests.helpers import (assert_same_as_loop, keyed_state, run_params as _run, toy_problem,
                           toy_simulation)

SIZES = (7, 12, 3, 9, 5, 8, 0, 11)   # an empty client too
ONE_STEP = dict(local_epochs=1, batch_size=12, lr=0.5)


@pytest.mark.parametrize("privacy,devices,client_batch", [
    (dict(dp="central"), 1, 0),
    (dict(dp="central", clip_parts="per_layer"), 2, 3),
    (dict(dp="central", adaptive_clipping=True, sampling="poisson", clients_per_round=5,
          max_cohort=8), 4, 0),
    (dict(dp="local"), 1, 2),
    (dict(dp="local", clip_parts="per_layer"), 4, 0),
    (dict(dp="bandmf", sampling="cyclic", clients_per_round=4, rounds=4), 2, 0),
])
def test_clipped_one_step_equals_the_per_client_loop(privacy, devices, client_batch):
  """Same rounds as the per-client loop (its clip, then the sum), noise included (the
  server's, or local DP's summed reports: the same draw on both paths), some clients
  clipped and some not, on 1 and several devices, in chunks."""
  x, y, parts = toy_problem(sizes=SIZES, seed=1)
  common = dict(ONE_STEP, clip_norm=0.15, noise_multiplier=0.3, devices=devices, **privacy)
  fast = toy_simulation(x, y, parts, client_parallelism="one_step", client_batch=client_batch,
                        **common)
  loop = toy_simulation(x, y, parts, client_parallelism="map", **common)
  stats = assert_same_as_loop(fast, loop)
  unclipped = int(np.sum(stats.metrics["mechanism"]["unclipped"]))
  assert 0 < unclipped < int(np.sum(stats.participants)) - 3


@pytest.mark.parametrize("model, extra", [("cnn", dict(hidden=[5])),
                                          ("leaf_cnn", dict(hidden=[200, 200], lr=0.01, clip_norm=0.03))])
def test_clipped_one_step_for_convolutions(model, extra):
  """Convolutions' norms from per-client gradients, the dense layers' from their taps
  (leaf_cnn: its 2048-wide layer at a learning rate that does not diverge, where the
  loss's summation order would grow)."""
  x, y, parts = toy_problem(sizes=SIZES, features=16, seed=2)
  x = x.reshape(-1, 4, 4, 1)
  common = dict(ONE_STEP, dp="central", clip_norm=0.3, noise_multiplier=0.3, model=model)
  common.update(extra)
  stats = assert_same_as_loop(toy_simulation(x, y, parts, **common),
                              toy_simulation(x, y, parts, client_parallelism="map", **common))
  assert 0 < int(np.asarray(stats.metrics["mechanism"]["unclipped"])[0]) < 7


def test_clipped_one_step_for_tiers():
  """Sensitivity tiers split the first kernel by rows: each row's norm from the taps."""
  x, y, parts = toy_problem(sizes=SIZES, seed=3)
  tiers = np.array([0, 1, 1, 2, 3, 0])
  common = dict(ONE_STEP, dp="central", clip_norm=0.3, noise_multiplier=0.3,
                clip_parts="tiers", feature_tiers=tiers)
  assert_same_as_loop(toy_simulation(x, y, parts, **common),
                      toy_simulation(x, y, parts, client_parallelism="map", **common))


@pytest.mark.parametrize("tap_dense", [True, False])
def test_clipped_sum_and_norms_against_per_client_gradients(tap_dense):
  """train_cohort_clipped against each client's own gradient, clipped and summed
  here; a client with a NaN example is sent as zero, its norm not finite."""
  from fedjax_dp.core.one_step_clipped import train_cohort_clipped
  from fedjax_dp.losses import masked_cross_entropy
  from fedjax_dp.privacy.clip_layout import clip_layout
  model = make_model("mlp", (6,), 3, [8, 4])
  params = model.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 6)).astype(np.float32)
  x[33, 2] = np.nan                                   # client 4's third example
  y = rng.integers(0, 3, 40).astype(np.int32)
  counts = np.array([5, 3, 0, 6, 4, 2], np.int32)
  rows = np.arange(36, dtype=np.int32).reshape(6, 6)
  rows[4] = np.arange(31, 37)                         # 31-34 its examples: 33 among them
  rows[5] = np.arange(6)                              # no client's padding reads row 33

  def loss_fn(p, xb, yb, mb):
    value = masked_cross_entropy(model.apply(p, xb), yb, mb)
    return value, value
  lr, clip = 0.7, 0.4
  took = counts > 0
  res, total, norms, var = train_cohort_clipped(
      loss_fn, params, jnp.asarray(rows), jnp.asarray(counts), jnp.asarray(took),
      jnp.full((6,), 2.0), lr, jnp.asarray(x), jnp.asarray(y), 4, clip_norm=clip,
      layout=clip_layout(params, "flat"), uniform=True, tap_dense=tap_dense)
  want = jax.tree.map(jnp.zeros_like, params)
  for i in range(6):
    mask = np.arange(6) < counts[i]
    g = jax.grad(lambda p: loss_fn(p, x[rows[i]], y[rows[i]], mask)[0])(params)
    norm = lr * float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(g))))
    if i == 4:
      assert not np.isfinite(float(norms[i]))
      continue
    np.testing.assert_allclose(float(norms[i]), norm, rtol=1e-5)
    scale = min(1.0, clip / max(norm, 1e-30)) * took[i]
    want = jax.tree.map(lambda w, a: w - lr * scale * a, want, g)
  for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
  assert float(var) == pytest.approx(4.0 * int(np.sum(took)))


@pytest.mark.parametrize("rows,by_row", [(3, False), (3, True), (40, False), (40, True)])
def test_kernel_norms_from_grams_and_from_gradients(rows, by_row):
  """Both of kernel_sq_norms' routes (Gram matrices for few rows, the gradient for many)."""
  rng = np.random.default_rng(rows)
  a = rng.normal(size=(5, rows, 6)).astype(np.float32)
  e = rng.normal(size=(5, rows, 4)).astype(np.float32)
  g = np.einsum("cri,cro->cio", a, e)
  want = np.sum(g ** 2, axis=2) if by_row else np.sum(g ** 2, axis=(1, 2))
  sq, slack = layer_taps.kernel_sq_norms(jnp.asarray(a), jnp.asarray(e), by_row)
  np.testing.assert_allclose(sq, want, rtol=1e-4)
  assert np.all(np.asarray(slack) <= 1e-4 * want) and np.all(np.asarray(slack) >= 0)


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e6])
def test_the_clip_bounds_what_is_added_where_the_examples_cancel(scale):
  """Two examples of one input whose output gradients nearly cancel (as a client's
  own data can make them): the Gram norm alone is rounding noise, clamped at 0 (it
  went negative) or far below what the sum adds; the clip's norm is raised by the
  rounding bounds, so each client's contribution stays within C."""
  from fedjax_dp.core.one_step_clipped import clipped_sum
  from fedjax_dp.privacy.clip_layout import ClipLayout
  rng = np.random.default_rng(0)
  clip = 1e-3
  for trial in range(20):
    x = scale * rng.normal(size=(1, 1, 64)).astype(np.float32)
    v = rng.normal(size=(1, 1, 16)).astype(np.float32)
    a = np.concatenate([x, x], axis=1)
    e = np.concatenate([v, -v * np.float32(1 + 3e-7 * (trial % 4))], axis=1)
    summed, norms = clipped_sum([("kernel", jnp.asarray(a), jnp.asarray(e))], jnp.ones((1,)),
                                1.0, clip, ClipLayout((0,), (1.0,), ("all",)))
    added = float(np.linalg.norm(np.asarray(summed[0], np.float64)))
    assert np.isfinite(float(norms[0])) and float(norms[0]) >= 0
    assert added <= clip * (1 + 1e-5), (trial, added)


def test_taps_record_each_dense_call():
  model = make_model("cnn", (8, 8, 1), 10, [16])
  params = model.init(jax.random.PRNGKey(0))
  calls = layer_taps.dense_calls(model.apply, params, jnp.zeros((3, 8, 8, 1)))
  assert [(c.path, c.in_shape, c.out_shape) for c in calls] == [
      (("Dense_0",), (3, 256), (3, 16)), (("Dense_1",), (3, 16), (3, 10))]
  owned = layer_taps.dense_leaves(params, calls)
  assert sorted(set(owned.values())) == [(("Dense_0",), "bias"), (("Dense_0",), "kernel"),
                                         (("Dense_1",), "bias"), (("Dense_1",), "kernel")]


def _noise_std(sim, z, key):
  """The std over coordinates of the round's noise: the differential method (the run
  at z against the run at negligible z, the same key)."""
  a, _ = _run(sim.with_hparams(noise_multiplier=z), 1, keyed_state(sim, key))
  b, _ = _run(sim.with_hparams(noise_multiplier=1e-6), 1, keyed_state(sim, key))
  return np.std(np.concatenate([(u - v).ravel() for u, v in zip(a, b)]))


@pytest.mark.parametrize("draw", ["client", "aggregate"])
def test_summed_reports_noise_has_the_reports_distribution(draw):
  """One draw for the sum, or each report's own: the mean's noise has std z C /
  sqrt(m) either way (m participants, server lr 1; 1,300 coordinates: within 10 %)."""
  x, y, parts = toy_problem(sizes=SIZES, seed=4)
  sim = toy_simulation(x, y, parts, **ONE_STEP, hidden=[160], dp="local", clip_norm=0.2,
                       noise_multiplier=1.0, local_noise_draw=draw)
  assert sim.client_parallelism == ("one_step" if draw == "aggregate" else "map")
  m = sum(1 for p in parts if len(p))
  std = _noise_std(sim, 1.0, jax.random.PRNGKey(7))
  assert std == pytest.approx(1.0 * 0.2 / np.sqrt(m), rel=0.1)


def test_local_noise_draw_choices_are_checked():
  x, y, parts = toy_problem(sizes=SIZES)
  with pytest.raises(ConfigError, match="local_noise_draw"):
    toy_simulation(x, y, parts, **ONE_STEP, dp="central", noise_multiplier=1.0,
                   local_noise_draw="client")
  with pytest.raises(ConfigError, match="'local_noise_draw' = 'aggregate': a stage of this run "
                                        "reads each report"):
    toy_simulation(x, y, parts, **ONE_STEP, dp="local", noise_multiplier=1.0,
                   aggregator="median", local_noise_draw="aggregate")
  with pytest.raises(ConfigError, match="'client_parallelism' = 'one_step': a stage reads each "
                                        "upload"):
    toy_simulation(x, y, parts, **ONE_STEP, dp="local", noise_multiplier=1.0,
                   local_noise_draw="client", client_parallelism="one_step")
