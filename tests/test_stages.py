"""Every registered aggregator and local term as a stage on its own, without the
round: jittable (and the eager call gives the compiled one's numbers), output
shapes, masked slots (huge, NaN or inf) have no effect, works under vmap
over a batch of inputs and over a batch of hyperparameters, hyperparameters
passed as float32 / int32 arrays give the config's Python numbers bit for bit
(hyperparameters as data), and its state round-trips (same structure, shapes
and dtypes)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import TERMS, LocalContext, ServerContext
from fedjax_dp import make_config
from fedjax_dp.recipes.flat import build_stage
from fedjax_dp.robust import AGGREGATORS
from tests.helpers import objective_of

# one config every stage reads its numbers from, outside any one run (so the keys of
# rules and terms the config does not turn on are allowed: refuse_unread=False)
CFG = make_config({"byzantine_f": 1, "clients_per_round": 8, "num_clients": 8},
                  refuse_unread=False)
M, D = 9, 6


def same_structure(a, b):
  """Equal tree structure, leaf shapes and dtypes."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert jnp.shape(x) == jnp.shape(y) and jnp.result_type(x) == jnp.result_type(y)


def other_hp(hp):
  """A second, still valid value of every hyperparameter (floats x1.5, counts + 1)."""
  return {k: (v + 1 if isinstance(v, int) else 1.5 * v) for k, v in hp.items()}


def as_data(hp):
  """hp as the round will pass it: float32 (rounded once) and int32 arrays."""
  return {k: jnp.asarray(v, jnp.int32 if isinstance(v, int) else jnp.float32)
          for k, v in hp.items()}


def stacked_hp(*hps):
  """[len(hps)] arrays per key: float32 for floats, int32 for counts (as data)."""
  return {k: jnp.asarray([h[k] for h in hps],
                         jnp.int32 if isinstance(hps[0][k], int) else jnp.float32)
          for k in hps[0]}


def cohort(seed):
  rng = np.random.default_rng(seed)
  u = rng.normal(size=(M, D)).astype(np.float32)
  mask = rng.uniform(size=M) < 0.7
  mask[:2] = True
  w = rng.uniform(1, 4, size=M).astype(np.float32)
  return u, mask, w


# ------------------------------------------------------------------ aggregators
@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_aggregator_as_a_stage(name):
  rule = build_stage("aggregator", name, CFG)
  hp = dict(rule.hparams)
  state0 = rule.init(D, CFG.num_clients)
  aggregate = jax.jit(rule.aggregate)
  u, mask, w = cohort(0)
  agg, state, metrics = aggregate(u, mask, w, state0, hp)
  for a, b in zip(jax.tree.leaves(rule.aggregate(u, mask, w, state0, hp)),   # eager
                  jax.tree.leaves((agg, state, metrics))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert agg.shape == (D,) and agg.dtype == jnp.float32 and np.all(np.isfinite(agg))
  # the counts every rule reports (per-cluster noise is the cluster rule's own state:
  # tests/test_robust_aggregation.py)
  assert set(metrics) == {"flagged", "clusters"}
  assert all(metrics[k].shape == () and metrics[k].dtype == jnp.int32
             for k in ("flagged", "clusters"))
  same_structure(state, state0)
  assert (not jax.tree.leaves(state)) == (not rule.stateful)   # () when stateless
  # the state round-trips: fed back, it runs again and keeps its structure
  _, state2, _ = aggregate(u, mask, w, state, hp)
  same_structure(state2, state0)

  # masked slots have no effect: other garbage and weights there change nothing
  for bad in (1e6 * np.random.default_rng(1).normal(size=((~mask).sum(), D)), np.nan, np.inf):
    u2, w2 = u.copy(), w.copy()
    u2[~mask] = bad
    w2[~mask] = 100.0 if np.all(np.isfinite(bad)) else bad
    agg2, state_b, metrics2 = aggregate(u2, mask, w2, state0, hp)
    np.testing.assert_array_equal(agg2, agg)
    for a, b in zip(jax.tree.leaves((state_b, metrics2)), jax.tree.leaves((state, metrics))):
      np.testing.assert_array_equal(a, b)

  # vmap over a batch of cohorts (and of states) equals one call each
  batch = [cohort(s) for s in (2, 3, 4)]
  states = jax.tree.map(lambda a: jnp.stack([a] * 3), state0)
  stack = lambda i: jnp.stack([jnp.asarray(b[i]) for b in batch])
  aggs, _, mets = jax.jit(jax.vmap(rule.aggregate, in_axes=(0, 0, 0, 0, None)))(
      stack(0), stack(1), stack(2), states, hp)
  for i, b in enumerate(batch):
    one, _, met = aggregate(*b, state0, hp)
    np.testing.assert_allclose(aggs[i], one, rtol=1e-5, atol=1e-6)
    assert int(mets["flagged"][i]) == int(met["flagged"])

  # hyperparameters as data: passed as traced arrays they give the numbers of the
  # Python constants the round bakes in today, bit for bit
  hp2 = other_hp(hp)
  for h in (hp, hp2):
    baked = jax.jit(lambda u, mask, w, state, h=h: rule.aggregate(u, mask, w, state, h))
    for a, b in zip(jax.tree.leaves(aggregate(u, mask, w, state0, as_data(h))),
                    jax.tree.leaves(baked(u, mask, w, state0))):
      np.testing.assert_array_equal(a, b)
  # and a batch of hp values, traced, equals each value's call
  if hp:
    aggs, _, _ = jax.jit(jax.vmap(rule.aggregate, in_axes=(None, None, None, None, 0)))(
        u, mask, w, state0, stacked_hp(hp, hp2))
    for i, h in enumerate((hp, hp2)):
      np.testing.assert_allclose(aggs[i], aggregate(u, mask, w, state0, h)[0],
                                 rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ local terms
RNG = np.random.default_rng(0)
PARAMS = {"w": jnp.asarray(RNG.normal(size=(3, 2)), jnp.float32),
          "b": jnp.asarray(RNG.normal(size=(2,)), jnp.float32)}
XB = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)
YB = jnp.asarray([0, 1, 1, 0], jnp.int32)
MB = jnp.asarray([True, True, True, False])


def apply_fn(p, x):
  return x @ p["w"] + p["b"]


def features_fn(p, x):
  z = jnp.tanh(x @ p["w"])
  return z + p["b"], z


def random_like(tree, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: (jnp.ones_like(a) if a.dtype == bool else
                                 jnp.asarray(rng.normal(size=a.shape), a.dtype)), tree)


TERM_CASES = [(name, CFG) for name in TERMS] + [
    ("contrastive", dataclasses.replace(CFG, contrastive_form="moon_params"))]


@pytest.mark.parametrize("name,cfg", TERM_CASES,
                         ids=[n if c is CFG else n + "-" + c.contrastive_form
                              for n, c in TERM_CASES])
def test_local_term_as_a_stage(name, cfg):
  obj = objective_of((name,), cfg)
  hp = obj.hyperparameters()
  client0, server0 = obj.init_client_state(PARAMS), obj.init_server_state(PARAMS)
  cstate, sstate = random_like(client0, 1), random_like(server0, 2)
  w_t = random_like(PARAMS, 3)
  ctx = LocalContext(w_t, cstate, sstate)

  def loss(p, xb, hp):
    return obj.make_loss(apply_fn, features_fn, ctx, hp)(p, xb, YB, MB)[0]
  value, grad = jax.jit(jax.value_and_grad(loss))(PARAMS, XB, hp)
  for a, b in zip(jax.tree.leaves(jax.value_and_grad(loss)(PARAMS, XB, hp)),   # eager
                  jax.tree.leaves((value, grad))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert value.shape == () and np.isfinite(value)
  same_structure(grad, PARAMS)
  # masked examples have no effect
  xb2 = XB.at[3].set(1e3)
  value2, grad2 = jax.jit(jax.value_and_grad(loss))(PARAMS, xb2, hp)
  np.testing.assert_array_equal(value2, value)
  for a, b in zip(jax.tree.leaves(grad2), jax.tree.leaves(grad)):
    np.testing.assert_array_equal(a, b)
  # hyperparameters as data: traced arrays give the numbers of the Python constants the
  # round bakes in today, bit for bit at the config's values. At others (a tau whose
  # reciprocal is inexact) XLA:CPU at the tests' LLVM level 0 may round moon's and
  # moon_params' products of mu and 1/tau differently when they are constants (an ulp;
  # equal at the default level): the term computes the same expression either way.
  hp2 = {t: other_hp(v) for t, v in hp.items()}
  for h, exact in ((hp, True), (hp2, not obj.needs_prev_model or name == "contrastive"
                                and cfg.contrastive_form == "bounded")):
    baked = jax.jit(jax.value_and_grad(lambda p, xb, h=h: loss(p, xb, h)))
    traced = jax.jit(jax.value_and_grad(loss))(PARAMS, XB, {t: as_data(v) for t, v in h.items()})
    for a, b in zip(jax.tree.leaves(traced), jax.tree.leaves(baked(PARAMS, XB))):
      if exact:
        np.testing.assert_array_equal(a, b)
      else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
  if any(hp.values()):
    batch = {t: stacked_hp(hp[t], hp2[t]) for t in hp}
    values = jax.jit(jax.vmap(loss, in_axes=(None, None, 0)))(PARAMS, XB, batch)
    for i, h in enumerate((hp, hp2)):
      np.testing.assert_allclose(values[i], loss(PARAMS, XB, h), rtol=1e-5, atol=1e-6)

  delta = random_like(PARAMS, 4)
  local = jax.tree.map(jnp.add, w_t, delta)

  def finish_eager(cstate, delta, local, took_part):
    return obj.finish(LocalContext(w_t, cstate, sstate), delta, local, jnp.int32(3),
                      jnp.float32(0.1), took_part, True, hp)
  finish = jax.jit(finish_eager)
  upload, new_state, contrib = finish(cstate, delta, local, jnp.bool_(True))
  for a, b in zip(jax.tree.leaves(finish_eager(cstate, delta, local, jnp.bool_(True))),
                  jax.tree.leaves((upload, new_state, contrib))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  finish_with = lambda c, d, l, t, h: obj.finish(
      LocalContext(w_t, c, sstate), d, l, jnp.int32(3), jnp.float32(0.1), t, True, h)
  for h in (hp, hp2):   # traced hyperparameters: the baked-in constants' numbers
    baked = jax.jit(lambda c, d, l, t, h=h: finish_with(c, d, l, t, h))
    traced = jax.jit(finish_with)(cstate, delta, local, jnp.bool_(True),
                                  {n: as_data(v) for n, v in h.items()})
    for a, b in zip(jax.tree.leaves(traced),
                    jax.tree.leaves(baked(cstate, delta, local, jnp.bool_(True)))):
      np.testing.assert_array_equal(a, b)
  same_structure(upload, delta)
  same_structure(new_state, client0)          # the state round-trips
  # a slot that does not take part keeps its row and contributes nothing
  _, kept, none = finish(cstate, delta, local, jnp.bool_(False))
  for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(cstate)):
    np.testing.assert_array_equal(a, b)
  assert all(not np.any(np.asarray(c)) for c in jax.tree.leaves(none))
  # vmap over a batch of clients equals one call each
  rows = [random_like(client0, 10 + i) for i in range(3)]
  deltas = [random_like(PARAMS, 20 + i) for i in range(3)]
  stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
  part = jnp.asarray([True, False, True])
  out = jax.vmap(finish)(stack(rows), stack(deltas), stack(deltas), part)
  for i in range(3):
    one = finish(rows[i], deltas[i], deltas[i], part[i])
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(out)):
      np.testing.assert_allclose(b[i], a, rtol=1e-6, atol=1e-7)

  # the server's side keeps its structure
  server_step = lambda s, c: obj.server_step(s, c, 8, hp)
  new_server = jax.jit(server_step)(sstate, contrib)
  same_structure(new_server, server0)
  server_update = lambda u, s, m, a, h: obj.server_update(u, s, ServerContext(8, m, a), h)
  update, after = jax.jit(server_update)(delta, sstate, jnp.int32(2), jnp.bool_(True), hp)
  eager = (server_step(sstate, contrib),
           server_update(delta, sstate, jnp.int32(2), jnp.bool_(True), hp))
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves((new_server, (update, after)))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  same_structure(update, delta)
  same_structure(after, server0)
  for h in (hp, hp2):   # traced hyperparameters: the baked-in constants' numbers
    baked = jax.jit(lambda u, s, m, a, h=h: server_update(u, s, m, a, h))
    traced = jax.jit(server_update)(delta, sstate, jnp.int32(2), jnp.bool_(True),
                                    {n: as_data(v) for n, v in h.items()})
    for a, b in zip(jax.tree.leaves(traced),
                    jax.tree.leaves(baked(delta, sstate, jnp.int32(2), jnp.bool_(True)))):
      np.testing.assert_array_equal(a, b)
