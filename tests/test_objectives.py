"""Local objectives: each term's gradient against a hand-computed value, and
FedProx, SCAFFOLD, FedADMM and the contrastive term against plain per-client loops."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dataclasses

from fedjax_dp import algorithms
from fedjax_dp.algorithms.contrastive import bounded_push
from fedjax_dp.config import Config
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.core.state import CLIENT_TRAINING, COHORT_SAMPLING
from tests.helpers import flat, objective_of, toy_problem, toy_simulation


RNG = np.random.default_rng(0)
W = {"a": RNG.normal(size=(3, 4)), "b": RNG.normal(size=(4,))}
W_T = jax.tree.map(lambda v: v + 0.3 * RNG.normal(size=v.shape), W)
W_PREV = jax.tree.map(lambda v: v + 0.2 * RNG.normal(size=v.shape), W)
C_SERVER = jax.tree.map(lambda v: RNG.normal(size=v.shape), W)
C_CLIENT = jax.tree.map(lambda v: RNG.normal(size=v.shape), W)
DUAL = jax.tree.map(lambda v: RNG.normal(size=v.shape), W)


def objective(terms=(), prox_mu=0.001, contrastive_form="bounded", mu1=0.01, mu2=0.005,
              radius=1.0, contrastive_tau=0.5, rho=0.01, momentum=0.0):
  """The composite objective of `terms` with these numbers (the old keyword names)."""
  cfg = dataclasses.replace(Config(), prox_mu=prox_mu, contrastive_form=contrastive_form,
                            contrastive_mu1=mu1, contrastive_mu2=mu2,
                            contrastive_radius=radius, contrastive_tau=contrastive_tau,
                            admm_rho=rho, momentum=momentum)
  return objective_of(tuple(terms), cfg)


def penalty_grad(objective, client_state, server_state=None):
  """Gradient of the objective's added terms at W (the CE part is made constant)."""
  ctx = algorithms.LocalContext(jax.tree.map(jnp.asarray, W_T),
                                jax.tree.map(jnp.asarray, client_state),
                                jax.tree.map(jnp.asarray, server_state or {}))
  zero_logits = lambda p, x: jnp.zeros((x.shape[0], 3))
  loss = objective.make_loss(zero_logits, None, ctx)
  xb, yb, mb = jnp.zeros((2, 1)), jnp.zeros(2, jnp.int32), jnp.ones(2, bool)
  g = jax.grad(lambda p: loss(p, xb, yb, mb)[0])(jax.tree.map(jnp.asarray, W))
  return flat(g)


def fl(tree):
  return np.concatenate([np.ravel(v) for v in jax.tree.leaves(tree)])


def test_fedprox_gradient():
  g = penalty_grad(objective(terms=("fedprox",), prox_mu=0.3), {})
  np.testing.assert_allclose(g, 0.3 * (fl(W) - fl(W_T)), rtol=1e-5)


@pytest.mark.parametrize("radius", [10.0, 0.1])
def test_bounded_contrastive_gradient(radius):
  obj = objective(terms=("contrastive",), mu1=0.2, mu2=0.5, radius=radius)
  g = penalty_grad(obj, {"prev_model": W_PREV, "seen": True})
  inside = np.sum((fl(W) - fl(W_PREV)) ** 2) < radius ** 2
  want = 0.2 * (fl(W) - fl(W_T)) - (0.5 * (fl(W) - fl(W_PREV)) if inside else 0.0)
  np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
  # a client seen for the first time uses w^t as its previous model
  g0 = penalty_grad(obj, {"prev_model": W_PREV, "seen": False})
  inside0 = np.sum((fl(W) - fl(W_T)) ** 2) < radius ** 2
  want0 = 0.2 * (fl(W) - fl(W_T)) - (0.5 * (fl(W) - fl(W_T)) if inside0 else 0.0)
  np.testing.assert_allclose(g0, want0, rtol=1e-5, atol=1e-6)


def test_bounded_push_matches_autodiff_of_its_formula():
  """The hand-written backward pass (which recomputes p - prev) equals autodiff of
  -1/2 min(||p - prev||^2, r^2): inside, outside and exactly on the radius."""
  plain = lambda p, q, r2: -0.5 * jnp.minimum(
      sum(jnp.sum(jnp.square(a - b)) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q))), r2)
  p, q = jax.tree.map(jnp.asarray, W), jax.tree.map(jnp.asarray, W_PREV)
  d2 = float(np.sum((fl(W) - fl(W_PREV)) ** 2))
  for r2 in (2.0 * d2, 0.5 * d2):
    np.testing.assert_allclose(bounded_push(p, q, r2), plain(p, q, r2), rtol=1e-6)
    np.testing.assert_allclose(flat(jax.grad(bounded_push)(p, q, r2)),
                               flat(jax.grad(plain)(p, q, r2)), rtol=1e-6, atol=1e-7)
  on = ({"a": jnp.array([3.0, 0.0])}, {"a": jnp.array([0.0, 4.0])})   # distance 5 exactly
  np.testing.assert_array_equal(flat(jax.grad(bounded_push)(*on, 25.0)),
                                flat(jax.grad(plain)(*on, 25.0)))     # jnp.minimum's tie: 1/2
  np.testing.assert_array_equal(flat(jax.grad(bounded_push)(*on, 25.0)), [-1.5, 2.0])


def test_moon_params_contrastive_gradient():
  tau, mu = 0.5, 0.7
  obj = objective(terms=("contrastive",), contrastive_form="moon_params", mu1=mu,
                             contrastive_tau=tau)
  g = penalty_grad(obj, {"prev_model": W_PREV, "seen": True})
  w, wt, wp = fl(W), fl(W_T), fl(W_PREV)

  def cos_and_grad(v):  # d cos(w, v) / dw = v / (|w||v|) - cos w / |w|^2
    c = w @ v / (np.linalg.norm(w) * np.linalg.norm(v))
    return c, v / (np.linalg.norm(w) * np.linalg.norm(v)) - c * w / (w @ w)
  sg, dg = cos_and_grad(wt)
  sp, dp = cos_and_grad(wp)
  sigmoid = 1 / (1 + np.exp(-(sp - sg) / tau))   # d softplus(u) = sigmoid(u)
  np.testing.assert_allclose(g, mu * sigmoid * (dp - dg) / tau, rtol=1e-4, atol=1e-7)


def test_scaffold_and_fedadmm_gradients():
  g = penalty_grad(objective(terms=("scaffold",)), {"control": C_CLIENT},
                   {"control": C_SERVER})
  np.testing.assert_allclose(g, fl(C_SERVER) - fl(C_CLIENT), rtol=1e-5)
  g = penalty_grad(objective(terms=("fedadmm",), rho=0.4), {"dual": DUAL})
  np.testing.assert_allclose(g, fl(DUAL) + 0.4 * (fl(W) - fl(W_T)), rtol=1e-5)


def test_moon_representation_loss_against_numpy():
  """MOON on an MLP: the loss by a numpy forward pass, its gradient by central differences."""
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, algorithm="moon", moon_mu=0.8, moon_tau=0.5, hidden=[32])
  model = sim.model
  params = sim.init_state().params
  k = jax.random.PRNGKey(1)
  w_t = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(k, v.shape), params)
  prev = jax.tree.map(lambda v: v - 0.1 * jax.random.normal(k, v.shape), params)
  ctx = algorithms.LocalContext(w_t, {"prev_model": prev, "seen": jnp.bool_(True)}, {})
  obj = objective_of(algorithms.parse_algorithm(sim.cfg.algorithm)[0], sim.cfg)
  loss = obj.make_loss(lambda p, xb: jnp.zeros((xb.shape[0], 3)), model.apply_with_features, ctx)
  xb, yb, mb = jnp.asarray(x[:6]), jnp.asarray(y[:6]), jnp.array([1, 1, 1, 1, 0, 0], bool)

  def rep(p):  # numpy forward pass of the one-hidden-layer MLP: relu(x W0 + b0)
    d = p["Dense_0"]
    return np.maximum(np.asarray(x[:6], np.float64) @ np.asarray(d["kernel"], np.float64)
                      + np.asarray(d["bias"], np.float64), 0)

  def cos(a, b):
    return np.sum(a * b, -1) / np.maximum(
        np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)

  def numpy_moon(p):
    z, zg, zp = rep(p), rep(w_t), rep(prev)
    nll = np.log1p(np.exp((cos(z, zp) - cos(z, zg)) / 0.5))
    return 0.8 * np.mean(nll[:4])
  # MOON's objective is the cross-entropy of the model's own logits plus the term
  ce = lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
      model.apply(p, xb[:4]), yb[:4]))
  # jitted: one compile each (run eagerly, every op compiled on its own took ~10 s cold)
  assert float(jax.jit(lambda p: loss(p, xb, yb, mb)[0])(params)) == pytest.approx(
      float(jax.jit(ce)(params)) + numpy_moon(params), rel=1e-5)
  g = jax.jit(jax.grad(lambda p: loss(p, xb, yb, mb)[0] - ce(p)))(params)["Dense_0"]["kernel"]
  eps = 1e-4
  for (i, j) in [(0, 0), (2, 3), (5, 1)]:
    up = jax.tree.map(np.array, params)
    dn = jax.tree.map(np.array, params)
    up["Dense_0"]["kernel"][i, j] += eps
    dn["Dense_0"]["kernel"][i, j] -= eps
    fd = (numpy_moon(up) - numpy_moon(dn)) / (2 * eps)
    assert float(g[i, j]) == pytest.approx(fd, rel=2e-2, abs=1e-5)


# ------------------------------------------------------------- plain per-client loops


def reference_rounds(sim, x, y, parts, rounds):
  """FedProx / SCAFFOLD / FedADMM / FedDyn / bounded contrastive as loops over clients and
  batches, with the per-client state in Python dicts. Shared with the library: the
  key derivation, the epoch order rule, and jax.grad of the cross-entropy."""
  cfg, model = sim.cfg, sim.model
  term = cfg.algorithm
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), sim.init_state().params)
  zeros = lambda: jax.tree.map(np.zeros_like, params)
  c_server = zeros()
  c_client = {i: zeros() for i in range(cfg.num_clients)}
  dual = {i: zeros() for i in range(cfg.num_clients)}
  dyn_g = {i: zeros() for i in range(cfg.num_clients)}    # FedDyn's g_i, and its server h
  dyn_h = zeros()
  prev = {}
  own = {i: jax.tree.map(np.copy, params) for i in range(cfg.num_clients)}   # solo
  run_key = sim.init_state().key   # the release's key (recipes/release_identity.py)
  max_n = sim.store.max_examples

  # jitted so that each batch shape compiles once, not each operation of each step
  jit_ce_grad = jax.jit(jax.grad(lambda q, xb, yb: jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(model.apply(q, xb), yb))))

  def ce_grad(p, xb, yb):
    return jax.tree.map(np.asarray, jit_ce_grad(p, xb, yb))

  def extra_grad(w, c):
    if term == "fedprox":
      return jax.tree.map(lambda a, b: cfg.prox_mu * (a - b), w, params)
    if term == "solo":
      return zeros()
    if term == "scaffold":
      return jax.tree.map(np.subtract, c_server, c_client[c])
    if term == "fedadmm":
      return jax.tree.map(lambda yv, a, b: yv + cfg.admm_rho * (a - b), dual[c], w, params)
    if term == "feddyn":   # d/dw [-<g_i, w> + alpha/2 ||w - w^t||^2]
      return jax.tree.map(lambda g, a, b: -g + cfg.feddyn_alpha * (a - b), dyn_g[c], w, params)
    # bounded contrastive
    wp = prev.get(c, params)
    inside = sum(np.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(wp))) \
        < cfg.contrastive_radius ** 2
    return jax.tree.map(lambda a, b, q: cfg.contrastive_mu1 * (a - b)
                        - (cfg.contrastive_mu2 * (a - q) if inside else 0.0), w, params, wp)

  for r in range(rounds):
    lr = cfg.lr
    round_key = jax.random.fold_in(run_key, r)
    cohort = np.asarray(jax.random.permutation(
        jax.random.fold_in(round_key, COHORT_SAMPLING), cfg.num_clients))[:cfg.clients_per_round]
    client_key = jax.random.fold_in(round_key, CLIENT_TRAINING)
    uploads, weights, dc_sum = [], [], zeros()
    for c in map(int, cohort):
      idx, n = parts[c], len(parts[c])
      w = jax.tree.map(np.copy, own[c] if term == "solo" else params)
      mom = zeros()
      steps = 0
      epoch_keys = jax.random.split(jax.random.fold_in(client_key, c), cfg.local_epochs)
      for e in range(cfg.local_epochs):
        u = np.array(jax.random.uniform(epoch_keys[e], (max_n,)))
        u[n:] = 2.0
        order = np.argsort(u, kind="stable")[:n]
        for start in range(0, n, cfg.batch_size):
          ex = idx[order[start:start + cfg.batch_size]]
          g = jax.tree.map(np.add, ce_grad(w, x[ex], y[ex]), extra_grad(w, c))
          mom = jax.tree.map(lambda m, gi: gi + cfg.momentum * m, mom, g)
          w = jax.tree.map(lambda wi, m: wi - lr * m, w, mom)
          steps += 1
      delta = jax.tree.map(np.subtract, w, params)
      upload = delta
      if term == "scaffold" and steps > 0:
        # option II with momentum: K steps of a constant g move lr g sum_k (1 - b^k) / (1 - b)
        b = cfg.momentum
        eff = sum((1 - b ** k) / (1 - b) if b else 1.0 for k in range(1, steps + 1))
        new_c = jax.tree.map(lambda ci, cs, d: ci - cs - d / (eff * lr), c_client[c], c_server,
                             delta)
        dc_sum = jax.tree.map(lambda s, a, b: s + a - b, dc_sum, new_c, c_client[c])
        c_client[c] = new_c
      if term == "fedadmm":
        old = dual[c]
        dual[c] = jax.tree.map(lambda yv, d: yv + cfg.admm_rho * d, dual[c], delta)
        if cfg.admm_upload == "change":   # the augmented model's change
          upload = jax.tree.map(lambda d, yn, yo: d + (yn - yo) / cfg.admm_rho, delta,
                                dual[c], old)
        else:                             # the augmented model less w^t
          upload = jax.tree.map(lambda d, yv: d + yv / cfg.admm_rho, delta, dual[c])
      if term == "feddyn":
        dyn_g[c] = jax.tree.map(lambda g, d: g - cfg.feddyn_alpha * d, dyn_g[c], delta)
      if term == "contrastive":
        prev[c] = w
      if term == "solo":
        own[c] = w
        upload = zeros()
      uploads.append(upload)
      weights.append(float(n))
    total = sum(weights)
    mean = jax.tree.map(lambda *d: sum(wi * di for wi, di in zip(weights, d)) / total, *uploads)
    if term == "feddyn":
      # h <- h - alpha (1/N) sum_S (w_i - w^t), the sum as m times the released mean;
      # w^{t+1} = w^t + mean - h / alpha
      a, share = cfg.feddyn_alpha, cfg.clients_per_round / cfg.num_clients
      dyn_h = jax.tree.map(lambda h, u: h - a * share * u, dyn_h, mean)
      mean = jax.tree.map(lambda u, h: u - h / a, mean, dyn_h)
    params = jax.tree.map(np.add, params, mean)
    if term == "scaffold":
      c_server = jax.tree.map(lambda cs, s: cs + s / cfg.num_clients, c_server, dc_sum)
  return (params, own) if term == "solo" else params


TERMS = [dict(algorithm="fedprox", prox_mu=0.5), dict(algorithm="scaffold"),
         dict(algorithm="fedadmm", admm_rho=0.5),
         dict(algorithm="fedadmm", admm_rho=0.5, admm_upload="change"),
         dict(algorithm="contrastive", contrastive_mu1=0.3, contrastive_mu2=0.2,
              contrastive_radius=0.5)]


# `make test` runs every term on 1 device but FedADMM (client duals, per-client rows
# as SCAFFOLD's), and SCAFFOLD on 2 (a server control variate besides the clients');
# the others run in `make test-slow` (CI runs both).
IN_MAKE_TEST = {"1-fedprox", "1-scaffold", "1-contrastive", "2-scaffold"}


@pytest.mark.parametrize("devices, overrides", [
    pytest.param(d, o, id=f"{d}-{o['algorithm']}" + (f"-{o['admm_upload']}" if "admm_upload" in o
                                                      else ""),
                 marks=() if f"{d}-{o['algorithm']}" in IN_MAKE_TEST else pytest.mark.slow)
    for d in (1, 2) for o in TERMS])
def test_partial_cohorts_equal_plain_loops(overrides, devices):
  """2 of 4 clients per round for 4 rounds, so per-client state persists across
  rounds for clients that sit some out; 2 devices shard the cohort."""
  x, y, parts = toy_problem(sizes=(5, 9, 4, 13))
  sim = toy_simulation(x, y, parts, clients_per_round=2, batch_size=3, devices=devices,
                       **overrides)
  state, _ = sim.run_rounds(sim.init_state(), 4)
  expected = reference_rounds(sim, x, y, parts, 4)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)


def test_algorithm_names_and_errors():
  assert algorithms.parse_algorithm("fedprox+scaffold") == (("fedprox", "scaffold"), "sgd")
  assert algorithms.parse_algorithm("topksdp") == (("contrastive",), "sgd")
  assert algorithms.parse_algorithm("fedavgm") == ((), "momentum")
  with pytest.raises(ConfigError, match="'algorithm' = 'fedsgd'"):
    make_config({"algorithm": "fedsgd"})
  with pytest.raises(ConfigError, match="combines with nothing"):
    make_config({"algorithm": "solo+fedprox"})
  with pytest.raises(ConfigError, match="not privatized"):
    make_config({"algorithm": "scaffold", "dp": "central", "noise_multiplier": 1.0})
  with pytest.raises(ConfigError, match="feddyn does not combine with fedadmm"):
    make_config({"algorithm": "fedadmm+feddyn"})
  with pytest.raises(ConfigError, match="combines with nothing"):
    make_config({"algorithm": "feddyn+solo"})
  with pytest.raises(ConfigError, match="'feddyn_alpha' = 0: must be > 0"):
    make_config({"algorithm": "feddyn", "feddyn_alpha": 0})
  assert algorithms.parse_algorithm("feddyn+fedprox") == (("feddyn", "fedprox"), "sgd")
  with pytest.raises(ConfigError, match="'algorithm' = 'solo' with dp 'local'"):
    make_config({"algorithm": "solo", "dp": "local", "noise_multiplier": 1.0})


def test_solo_clients_train_alone():
  x, y, parts = toy_problem(sizes=(5, 9, 4, 13))
  sim = toy_simulation(x, y, parts, clients_per_round=2, batch_size=3, algorithm="solo")
  s0 = sim.init_state()
  p0 = flat(s0.params)
  state, _ = sim.run_rounds(s0, 4)
  params, own = reference_rounds(sim, x, y, parts, 4)
  np.testing.assert_array_equal(flat(state.params), p0)   # the server model never moves
  for c in range(4):
    got = flat(jax.tree.map(lambda a: a[c], state.client_state["model"]))
    np.testing.assert_allclose(got, flat(own[c]), atol=2e-5, rtol=1e-4)


def test_solo_accuracy_is_the_mean_of_label_weighted_client_accuracies():
  from fedjax_dp.core.evaluate import batch_for_eval, make_solo_evaluate
  x, y, parts = toy_problem(sizes=(30, 30, 30))
  sim = toy_simulation(x, y, parts, algorithm="solo", hidden=[8])
  state, _ = sim.run_rounds(sim.init_state(), 3)
  models = state.client_state["model"]
  rng = np.random.default_rng(0)
  xt = rng.normal(size=(50, x.shape[1])).astype(np.float32)
  yt = rng.integers(0, 3, size=50).astype(np.int32)
  dist = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], np.float32)
  acc, _ = make_solo_evaluate(sim.model)(models, *batch_for_eval(xt, yt, 16), dist)
  want = []
  for c in range(3):
    pred = np.argmax(np.asarray(sim.model.apply(jax.tree.map(lambda a: a[c], models), xt)), -1)
    per_class = [np.mean(pred[yt == k] == k) for k in range(3)]
    want.append(float(dist[c] @ per_class))
  assert float(acc) == pytest.approx(np.mean(want), rel=1e-5)


def test_solo_run_reports_the_mean_client_accuracy(tmp_path):
  import json
  import os
  from fedjax_dp.cli import main
  out = str(tmp_path / "s")
  sets = ["dataset=digits", "num_clients=6", "clients_per_round=6", "hidden=[16]",
          "batch_size=16", "lr=0.05", "rounds=6", "eval_every=3", "devices=1", "algorithm=solo"]
  assert main(["run", "--no-progress", "--out", out] + sum([["--set", s] for s in sets], [])) == 0
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["test_accuracy_is"].startswith("SOLO")
  assert 0.2 < summary["final"]["test_accuracy"] <= 1.0


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_scaffold_control_variate_is_the_gradient_under_client_momentum(momentum):
  """Found by an audit: option II's (w^t - w_i) / (K lr) assumes plain SGD; with
  momentum 0.5 a constant gradient [1, -2] gave c_i = [1.8, -3.6], 0.9 gave
  [4.1, -8.3]. K momentum steps of a constant g: c_i must come out g."""
  from fedjax_dp.training import client
  a = {"w": jnp.array([1.0, -2.0])}
  obj = objective(terms=("scaffold",), momentum=momentum)
  zeros = {"w": jnp.zeros(2)}
  ctx = algorithms.LocalContext(zeros, {"control": zeros}, {"control": zeros})
  linear = lambda p, xb, yb, mb: (jnp.sum(p["w"] * a["w"]), jnp.float32(0.0))
  x, y = jnp.zeros((40, 1)), jnp.zeros(40, jnp.int32)
  res = client.local_train(zeros, jnp.arange(40, dtype=jnp.int32), jnp.int32(40),
                           jax.random.PRNGKey(0), jnp.float32(0.01), apply_fn=None, x=x, y=y,
                           epochs=1, batch_size=4, momentum=momentum, loss_fn=linear)
  assert int(res.steps) == 10
  _, state, contrib = obj.finish(ctx, res.delta, res.params, res.steps, jnp.float32(0.01),
                                 jnp.bool_(True))
  np.testing.assert_allclose(state["control"]["w"], a["w"], rtol=1e-5)
  np.testing.assert_allclose(contrib["control"]["w"], a["w"], rtol=1e-5)
  # a client that ran no step keeps its control variate and moves nothing
  c_i = {"w": jnp.array([0.3, 0.4])}
  ctx = algorithms.LocalContext(zeros, {"control": c_i}, {"control": {"w": jnp.ones(2)}})
  _, state, contrib = obj.finish(ctx, zeros, zeros, jnp.int32(0), jnp.float32(0.01),
                                 jnp.bool_(True))
  np.testing.assert_array_equal(state["control"]["w"], c_i["w"])
  np.testing.assert_array_equal(contrib["control"]["w"], [0.0, 0.0])
