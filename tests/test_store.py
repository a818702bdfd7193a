"""Masking, cohort sampling and the padded index store."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.training import client as client_lib
from fedjax_dp.models import make_model
from fedjax_dp.placement.store import build_store, default_max_cohort, sample_cohort
from tests.helpers import toy_problem


def _train(model, params, x, y, row, count):
  return client_lib.local_train(params, jnp.asarray(row), jnp.int32(count), jax.random.PRNGKey(3),
                                jnp.float32(0.1), apply_fn=model.apply, x=jnp.asarray(x),
                                y=jnp.asarray(y), epochs=2, batch_size=4, momentum=0.5)


def test_padding_never_reaches_the_gradient():
  x, y, _ = toy_problem(sizes=(30,))
  model = make_model("mlp", (6,), 3, (5,))
  params = model.init(jax.random.PRNGKey(0))
  real = np.array([4, 9, 1, 17, 22, 5, 11], np.int32)  # 7 examples, padded to 12
  pads = [np.zeros(5, np.int32), np.array([29, 28, 27, 26, 25], np.int32)]
  deltas = [_train(model, params, x, y, np.concatenate([real, p]), 7).delta for p in pads]
  for a, b in zip(jax.tree.leaves(deltas[0]), jax.tree.leaves(deltas[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Garbage features at the padded indices: still the same update.
  x2 = x.copy()
  x2[25:] = 1e6
  d3 = _train(model, params, x2, y, np.concatenate([real, pads[1]]), 7).delta
  for a, b in zip(jax.tree.leaves(deltas[0]), jax.tree.leaves(d3)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_empty_client_is_a_no_op():
  x, y, _ = toy_problem(sizes=(12,))
  model = make_model("mlp", (6,), 3, (5,))
  params = model.init(jax.random.PRNGKey(0))
  res = _train(model, params, x, y, np.arange(12, dtype=np.int32), 0)
  assert all(float(jnp.abs(d).max()) == 0.0 for d in jax.tree.leaves(res.delta))
  assert float(res.examples) == 0.0 and float(res.loss_sum) == 0.0


def test_short_last_batch_is_the_mean_over_real_examples():
  """One epoch over 5 examples with batch 4 and plain SGD: two steps, the second on 1 example."""
  x, y, _ = toy_problem(sizes=(5,))
  model = make_model("mlp", (6,), 3, (5,))
  params = model.init(jax.random.PRNGKey(0))
  row = np.array([0, 1, 2, 3, 4, 0, 0, 0], np.int32)
  key = jax.random.PRNGKey(3)
  res = client_lib.local_train(params, jnp.asarray(row), jnp.int32(5), key, jnp.float32(0.1),
                               apply_fn=model.apply, x=jnp.asarray(x), y=jnp.asarray(y), epochs=1,
                               batch_size=4, momentum=0.0)
  order = np.asarray(client_lib.epoch_orders(key, jnp.int32(5), 8, 1))[0]
  assert sorted(order[:5]) == [0, 1, 2, 3, 4]
  import optax
  w = params
  grad = jax.jit(jax.grad(lambda p, xb, yb: jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb))))
  for batch in (order[:4], order[4:5]):
    g = grad(w, x[row[batch]], y[row[batch]])
    w = jax.tree.map(lambda a, b: a - 0.1 * b, w, g)
  for got, p, want in zip(jax.tree.leaves(res.delta), jax.tree.leaves(params), jax.tree.leaves(w)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want - p), atol=1e-6)


def test_store_rows_and_counts():
  parts = [np.array([3, 1]), np.array([0, 2, 4, 5, 6]), np.array([], dtype=np.int64)]
  store = build_store(np.zeros((7, 2)), np.zeros(7), parts, pad_to_multiple=4)
  assert store.client_index.shape == (3, 8)
  np.testing.assert_array_equal(np.asarray(store.client_count), [2, 5, 0])
  np.testing.assert_array_equal(np.asarray(store.client_index[1, :5]), [0, 2, 4, 5, 6])


def test_fixed_cohort_is_uniform_without_replacement():
  draws = jax.vmap(lambda k: sample_cohort(k, 10, 3, "fixed", 5).ids)(
      jax.random.split(jax.random.PRNGKey(0), 4000))
  draws = np.asarray(draws)
  assert all(len(set(row[:3])) == 3 for row in draws)
  freq = np.bincount(draws[:, :3].ravel(), minlength=10) / (4000 * 3)
  np.testing.assert_allclose(freq, 0.1, atol=0.015)
  mask = np.asarray(sample_cohort(jax.random.PRNGKey(1), 10, 3, "fixed", 5).mask)
  np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0])


def test_poisson_cohort_matches_independent_draws():
  key = jax.random.PRNGKey(7)
  c = sample_cohort(key, 1000, 50, "poisson", 120)
  joined = np.asarray(jax.random.bernoulli(key, 0.05, (1000,)))
  assert int(c.mask.sum()) == joined.sum()
  np.testing.assert_array_equal(np.asarray(c.ids)[np.asarray(c.mask)], np.nonzero(joined)[0])
  assert int(c.overflow) == 0
  small = sample_cohort(key, 1000, 50, "poisson", 10)
  assert int(small.overflow) == joined.sum() - 10 and int(small.mask.sum()) == 10
  sizes = jax.vmap(lambda k: sample_cohort(k, 1000, 50, "poisson", 120).mask.sum())(
      jax.random.split(key, 2000))
  assert abs(float(np.mean(sizes)) - 50) < 0.5   # sd of the mean: 6.9 / sqrt(2000) = 0.15
  assert default_max_cohort(1000, 50) == 50 + int(np.ceil(4 * np.sqrt(1000 * 0.05 * 0.95))) + 1


@pytest.mark.parametrize("sigmas", [6.0, -50.0])   # -50: the cut keeps too few, the fallback
def test_large_population_draw_is_the_k_smallest_keys(sigmas):
  """Over LARGE_POPULATION clients a fixed-size cohort is the k clients with the
  smallest uniform keys (ties by id): the same k-subset law as a permutation's
  first k. Against numpy's sort of the same keys, on both of its paths."""
  from fedjax_dp.placement.store import LARGE_POPULATION, smallest_keys_draw
  n, k = LARGE_POPULATION + 12345, 3000
  key = jax.random.PRNGKey(7)
  ids = np.asarray(jax.jit(lambda q: smallest_keys_draw(q, n, k, sigmas))(key))
  keys = np.asarray(jax.random.bits(key, (n,), jnp.uint32))
  np.testing.assert_array_equal(ids, np.lexsort((np.arange(n), keys))[:k])
  if sigmas > 0:   # the round's sampler takes this path above LARGE_POPULATION
    cohort = sample_cohort(key, n, k, "fixed", k + 5)
    np.testing.assert_array_equal(np.asarray(cohort.ids)[:k], ids)
    assert np.asarray(cohort.mask).sum() == k


def test_smallest_keys_draw_is_uniform():
  """Each of 40 clients lands in a 10-client draw with probability 1/4 (4,000
  draws: within 4.5 standard deviations), and draws never repeat a client."""
  from fedjax_dp.placement.store import smallest_keys_draw
  keys = jax.random.split(jax.random.PRNGKey(1), 4000)
  draws = np.asarray(jax.jit(jax.vmap(lambda q: smallest_keys_draw(q, 40, 10)))(keys))
  assert all(len(set(d)) == 10 for d in draws)
  freq = np.bincount(draws.ravel(), minlength=40) / 4000
  sd = np.sqrt(0.25 * 0.75 / 4000)
  assert np.max(np.abs(freq - 0.25)) < 4.5 * sd, freq
