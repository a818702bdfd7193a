"""FedDyn's term against a plain-numpy FedDyn on linear least squares (full-batch
gradient steps, partial cohorts, per-client state across rounds), with the
hyperparameter passed as a traced float32 array; and FedDyn in the round under DP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.training import client
from fedjax_dp.algorithms import TERMS, FinishInputs, LocalContext, LossInputs, ServerContext

N, D, n = 4, 3, 6          # clients, features, examples per client
ALPHA, LR, K = 0.3, 0.05, 5
COHORTS = [(0, 1), (2, 3), (1, 2), (0, 3), (0, 2)]


def problem():
  rng = np.random.default_rng(0)
  xs = rng.normal(size=(N, n, D))
  ys = xs @ rng.normal(size=D) + rng.normal(size=(N, n))       # each client its own noise
  xs[2] *= 2.0                                                 # heterogeneous clients
  return xs, ys


def numpy_feddyn(xs, ys, rounds):
  """Acar et al.'s Algorithm 1 with K full-batch gradient steps per client."""
  w_t, h = np.zeros(D), np.zeros(D)
  g = np.zeros((N, D))
  out = []
  for cohort in COHORTS[:rounds]:
    local = []
    for i in cohort:
      w = w_t.copy()
      for _ in range(K):
        grad = xs[i].T @ (xs[i] @ w - ys[i]) / n - g[i] + ALPHA * (w - w_t)
        w = w - LR * grad
      g[i] = g[i] - ALPHA * (w - w_t)
      local.append(w)
    h = h - ALPHA / N * sum(w - w_t for w in local)
    w_t = np.mean(local, axis=0) - h / ALPHA
    out.append((w_t.copy(), g.copy(), h.copy()))
  return out


def test_feddyn_term_on_least_squares_equals_numpy_feddyn():
  xs, ys = problem()
  term = TERMS["feddyn"](alpha=ALPHA)
  hp = {"alpha": jnp.float32(ALPHA)}              # a traced hyperparameter, not a constant
  x, y = jnp.asarray(xs.reshape(N * n, D), jnp.float32), jnp.asarray(ys.reshape(-1), jnp.float32)

  @jax.jit
  def train_client(w_t, g_row, i, hp):
    params, state = {"w": w_t}, {"feddyn_g": {"w": g_row}}
    ctx = LocalContext(params, state, {})

    def loss_fn(p, xb, yb, mb):
      r = jnp.where(mb, xb @ p["w"] - yb, 0.0)
      ls = 0.5 * jnp.sum(r * r) / jnp.sum(mb)
      inputs = LossInputs(p, params, None, state, {}, xb, mb, None, None)
      return ls + term.loss(inputs, hp), ls

    res = client.local_train(params, i * n + jnp.arange(n, dtype=jnp.int32), jnp.int32(n),
                             jax.random.PRNGKey(0), jnp.float32(LR), apply_fn=None, x=x, y=y,
                             epochs=K, batch_size=n, momentum=0.0, loss_fn=loss_fn)
    inputs = FinishInputs(ctx, res.delta, res.params, res.steps, jnp.float32(LR),
                          jnp.bool_(True), lambda new, old: new, 0.0)
    upload, state, contrib = term.finish(inputs, res.delta, state, hp)
    assert contrib == {}
    return upload["w"], state["feddyn_g"]["w"]

  server_update = jax.jit(lambda u, s, m, hp: term.server_update(
      u, s, ServerContext(num_clients=N, cohort_size=m, applied=jnp.bool_(True)), hp))
  w_t = jnp.zeros(D)
  g = jnp.zeros((N, D))
  server_state = term.init_server({"w": w_t})
  want = numpy_feddyn(xs, ys, len(COHORTS))
  for cohort, (w_ref, g_ref, h_ref) in zip(COHORTS, want):
    uploads = []
    for i in cohort:
      up, g_i = train_client(w_t, g[i], i, hp)
      uploads.append(up)
      g = g.at[i].set(g_i)
    mean = {"w": jnp.mean(jnp.stack(uploads), axis=0)}     # equal sizes: FedAvg's mean
    update, server_state = server_update(mean, server_state, len(cohort), hp)
    w_t = w_t + update["w"]
    np.testing.assert_allclose(w_t, w_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(server_state["feddyn_h"]["w"], h_ref, rtol=1e-5, atol=1e-6)
  # a round that is not applied (nobody took part, or a skipped DP round) keeps h
  kept, state = term.server_update(mean, server_state, ServerContext(N, 2, jnp.bool_(False)), hp)
  np.testing.assert_array_equal(state["feddyn_h"]["w"], server_state["feddyn_h"]["w"])
  np.testing.assert_allclose(kept["w"], mean["w"] - server_state["feddyn_h"]["w"] / ALPHA)


@pytest.mark.parametrize("devices", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_feddyn_round_equals_the_plain_loop(devices):
  """2 of 4 clients of unequal sizes per round for 4 rounds: the round against
  test_objectives' plain per-client loop (g_i in a dict, h, the correction)."""
  from tests.helpers import toy_problem, toy_simulation
  from tests.test_objectives import reference_rounds
  x, y, parts = toy_problem(sizes=(5, 9, 4, 13))
  sim = toy_simulation(x, y, parts, clients_per_round=2, batch_size=3, devices=devices,
                       algorithm="feddyn", feddyn_alpha=0.3)
  state, _ = sim.run_rounds(sim.init_state(), 4)
  expected = reference_rounds(sim, x, y, parts, 4)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dp", [pytest.param(dict(dp="local", noise_multiplier=0.5),
                                             marks=pytest.mark.slow),
                                dict(dp="central", noise_multiplier=0.5)])
def test_feddyn_under_dp_corrects_the_released_mean(dp):
  """Under DP the server's h is built from the released (noised) mean alone: in
  round one the model moves by mean - h / alpha with h = -alpha (m / N) mean
  (m: the participants under local DP, clients_per_round under central DP)."""
  from tests.helpers import flat, keyed_state, toy_problem, toy_simulation
  x, y, parts = toy_problem(sizes=(5, 9, 4, 13))
  fedprox = toy_simulation(x, y, parts, clients_per_round=2, algorithm="fedprox", prox_mu=0.2,
                           **dp)
  dyn = toy_simulation(x, y, parts, clients_per_round=2, algorithm="feddyn", feddyn_alpha=0.2,
                       **dp)
  s0 = keyed_state(dyn)
  p0 = flat(s0.params)
  s1, stats = dyn.run_rounds(s0, 1, same_draws=True)
  # round one: g_i = 0, so the local objective and the released mean are FedProx's with
  # mu = alpha (same keys, same noise)
  f1, _ = fedprox.run_rounds(keyed_state(fedprox), 1, same_draws=True)
  released = flat(f1.params) - p0
  h = flat(s1.server_state["feddyn_h"])
  np.testing.assert_allclose(h, -0.2 * (2 / 4) * released, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(flat(s1.params) - p0, released - h / 0.2, rtol=1e-4, atol=1e-6)
  assert int(stats.participants[0]) == 2
