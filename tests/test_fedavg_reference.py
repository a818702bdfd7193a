"""The compiled FedAvg round equals a plain Python per-client loop with the same keys."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core.state import CLIENT_TRAINING, COHORT_SAMPLING
from tests.helpers import toy_problem, toy_simulation


def reference_rounds(sim, x, y, parts, rounds):
  """FedAvg written the way a paper's reference code is: loops over clients and batches.

  Only the key derivation and the rule "each epoch visits the client's examples
  in the order argsort(uniform(epoch_key))" are shared with the library.
  """
  cfg, model = sim.cfg, sim.model
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), sim.init_state().params)
  server_m = jax.tree.map(np.zeros_like, params)   # fedavgm velocity / adam first moment
  server_v = jax.tree.map(np.zeros_like, params)   # adam second moment
  run_key = sim.init_state().key   # the release's key (recipes/release_identity.py)
  max_n = sim.store.max_examples

  # jitted so that each batch shape compiles once, not each operation of each step
  jit_grad = jax.jit(jax.grad(lambda q, xb, yb: jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(model.apply(q, xb), yb))))

  def grad(p, xb, yb):
    return jax.tree.map(np.asarray, jit_grad(p, xb, yb))

  for r in range(rounds):
    lr = cfg.lr
    if cfg.lr_schedule == "cosine":  # anneal from lr to lr_min over cfg.rounds
      lr = cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + np.cos(np.pi * r / cfg.rounds))
    round_key = jax.random.fold_in(run_key, r)
    cohort = np.asarray(jax.random.permutation(
        jax.random.fold_in(round_key, COHORT_SAMPLING), cfg.num_clients))[:cfg.clients_per_round]
    client_key = jax.random.fold_in(round_key, CLIENT_TRAINING)
    deltas, weights = [], []
    for c in cohort:
      idx, n = parts[c], len(parts[c])
      w = jax.tree.map(np.copy, params)
      mom = jax.tree.map(np.zeros_like, params)
      epoch_keys = jax.random.split(jax.random.fold_in(client_key, int(c)), cfg.local_epochs)
      for e in range(cfg.local_epochs):
        u = np.array(jax.random.uniform(epoch_keys[e], (max_n,)))
        u[n:] = 2.0
        order = np.argsort(u, kind="stable")[:n]
        for start in range(0, n, cfg.batch_size):
          ex = idx[order[start:start + cfg.batch_size]]
          g = grad(w, x[ex], y[ex])
          mom = jax.tree.map(lambda m, gi: gi + cfg.momentum * m, mom, g)
          w = jax.tree.map(lambda wi, m: wi - lr * m, w, mom)
      deltas.append(jax.tree.map(np.subtract, w, params))
      weights.append(float(n))
    total = sum(weights)
    mean = jax.tree.map(lambda *d: sum(wi * di for wi, di in zip(weights, d)) / total, *deltas)
    g = jax.tree.map(np.negative, mean)  # the server's pseudo-gradient
    if cfg.algorithm == "fedavg":
      params = jax.tree.map(lambda p, gi: p - cfg.server_lr * gi, params, g)
    elif cfg.algorithm == "fedavgm":
      server_m = jax.tree.map(lambda m, gi: cfg.server_momentum * m + gi, server_m, g)
      params = jax.tree.map(lambda p, m: p - cfg.server_lr * m, params, server_m)
    else:  # fedadam, bias-corrected as in Kingma and Ba
      b1, b2, t = cfg.server_beta1, cfg.server_beta2, r + 1
      server_m = jax.tree.map(lambda m, gi: b1 * m + (1 - b1) * gi, server_m, g)
      server_v = jax.tree.map(lambda v, gi: b2 * v + (1 - b2) * gi * gi, server_v, g)
      params = jax.tree.map(
          lambda p, m, v: p - cfg.server_lr * (m / (1 - b1 ** t)) /
          (np.sqrt(v / (1 - b2 ** t)) + cfg.server_eps), params, server_m, server_v)
  return params


@pytest.mark.parametrize("parallelism", ["map", "vmap"])
def test_round_equals_python_loop(parallelism):
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, client_parallelism=parallelism)
  state, stats = sim.run_rounds(sim.init_state(), 3)
  expected = reference_rounds(sim, x, y, parts, 3)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
  # every example visited once per epoch, every round
  np.testing.assert_array_equal(np.asarray(stats.examples), [2 * 22] * 3)
  assert int(state.participations) == 9


def test_partial_cohort_equals_python_loop():
  """Cohort of 2 of 4 clients: the sampling and the weights follow the loop."""
  x, y, parts = toy_problem(sizes=(5, 9, 4, 13))
  sim = toy_simulation(x, y, parts, clients_per_round=2, batch_size=3)
  state, _ = sim.run_rounds(sim.init_state(), 4)
  expected = reference_rounds(sim, x, y, parts, 4)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [
    dict(algorithm="fedavgm", server_lr=0.7, server_momentum=0.9),
    dict(algorithm="fedadam", server_lr=0.05, server_beta1=0.9, server_beta2=0.99,
         server_eps=1e-3),
    dict(lr_schedule="cosine", lr=0.2, lr_min=0.02, rounds=4),
])
def test_server_optimizers_and_schedule_equal_python_loop(overrides):
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, **overrides)
  state, _ = sim.run_rounds(sim.init_state(), 3)
  expected = reference_rounds(sim, x, y, parts, 3)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)
