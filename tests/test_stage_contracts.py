"""Contracts every stage keeps on its own, without running a round.

test_stages.py sweeps the aggregators and local terms (it shares its compiled
functions with these checks there); this file sweeps the rest of the round's
stages: client upload stages, server stages, the DP mechanism's round functions
and the Byzantine attacks:

  1. jittable: jit(update) gives the eager call's numbers;
  2. shapes: documented output shapes, and the state keeps its structure (the
     round's lax.scan needs a fixed carry);
  3. masks: a padded or refused slot's upload (zeros, huge, NaN) never changes an
     output; a per-client row is written only for a participant;
  4. keys: random stages draw from different keys for different clients, rounds
     and stages (a spy on jax.random records every draw's key);
  5. vmap: a stage vmapped over replicas of its numeric hyperparameters equals a
     loop over them (what sweeps rely on).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.adversary import attacks
from fedjax_dp.privacy import dp_round as dp_round_lib
from fedjax_dp.recipes import hparams as hparams_lib
from fedjax_dp.compression import pipeline as pl
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp.training import server_stages as ss
from fedjax_dp.core import state as sim_lib   # the round's key tags
from fedjax_dp.privacy.mechanisms.base import PrivacyState
from fedjax_dp.recipes.privacy import make_privacy
from fedjax_dp import make_config, recipes
from fedjax_dp.models import make_model
from fedjax_dp.placement.store import sample_cohort
from tests.helpers import make_test_runs


# ------------------------------------------------------------------ helpers
def same_structure(a, b):
  """Equal tree structure, leaf shapes and dtypes."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert jnp.shape(x) == jnp.shape(y) and jnp.result_type(x) == jnp.result_type(y)


def assert_trees_close(a, b, rtol=1e-6, atol=1e-6):
  """Same structure; floats allclose (NaN equal to NaN), the rest equal."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    if np.issubdtype(x.dtype, np.floating):
      np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
    else:
      np.testing.assert_array_equal(x, y)


def trees_differ(a, b) -> bool:
  return any(not np.allclose(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def jit_matches_eager(fn, *args):
  """(fn(*args) eagerly, jit(fn)), the two checked equal (contract 1); the later
  checks call the compiled one (eager calls cost a dispatch per op)."""
  eager, jitted = fn(*args), jax.jit(fn)
  assert_trees_close(jitted(*args), eager)
  return eager, jitted


def row(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


def stack(trees):
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def replicas(hp):
  """[2]-stacked hp: as given, and every number changed (floats x1.25, counts + 1),
  with float32 / int32 dtypes as the round passes them."""
  def two(v):
    v = np.asarray(v)
    other = v + 1 if np.issubdtype(v.dtype, np.integer) else v * np.float32(1.25)
    return jnp.asarray(np.stack([v, other.astype(v.dtype)]))
  return jax.tree.map(two, hp)


def vmap_matches_loop(fn, hp):
  """jit(vmap(fn)) over replicas(hp) equals fn at each replica (contract 5)."""
  batch = replicas(hp)
  out = jax.jit(jax.vmap(fn))(batch)
  for i in range(2):
    assert_trees_close(row(out, i), fn(row(batch, i)), rtol=1e-5, atol=1e-6)
  return out


def key(seed):
  return jax.random.PRNGKey(seed)


# ------------------------------------------------------------------ client upload stages
D = 40
CLIP, Z = 0.6, 0.3
TOPKSDP = make_config({"s_local": 0.75, "coordinate_clip": 0.5, "final_clip_l2": 1.0,
                       "kept_noise": "multiplier", "kept_noise_multiplier": 0.5,
                       "kept_noise_draw": "client", "index_selection": "random_k",
                       "num_clients": 8, "clients_per_round": 4})
PAPER = make_config({"s_local": 0.5, "update_clip_l2": 1.0, "kept_noise": "paper",
                     "ldp_epsilon": 8.0, "kept_noise_draw": "client", "num_clients": 8,
                     "clients_per_round": 4})

# name -> (make(number) -> ClientStage, its number (None: nothing numeric), draws randomness)
CLIENT_STAGES = {
    "identity": (lambda _: pl.identity(), None, False),
    "clip_per_coordinate": (pl.clip_per_coordinate, 0.3, False),
    "clip_l2": (pl.clip_l2, CLIP, False),
    "topk": (lambda _: pl.topk_with_error_feedback(0.75), None, False),
    "topk-no_error_feedback": (lambda _: pl.topk_with_error_feedback(0.75, error_feedback=False),
                               None, False),
    "topk-threshold": (lambda _: pl.topk_with_error_feedback(0.75, kernel="threshold"), None,
                       False),
    "topk-bisect": (lambda _: pl.topk_with_error_feedback(0.75, kernel="bisect"), None, False),
    "topk-final_clip": (lambda c: pl.topk_with_error_feedback(0.75, final_clip=c), CLIP, False),
    "random_k": (lambda _: pl.topk_with_error_feedback(0.75, "random_k"), None, True),
    "public_topk": (lambda _: pl.topk_with_error_feedback(0.75, "public_topk"), None, False),
    "kept_noise-client": (lambda z: pl.gaussian_on_kept(lambda ctx: jnp.asarray(z, jnp.float32)),
                          Z, True),
    "kept_noise-aggregate": (lambda z: pl.gaussian_on_kept(
        lambda ctx: jnp.asarray(z, jnp.float32), "aggregate"), Z, False),
    "kept_noise-paper": (lambda _: kept_noise.client_stage(
        kept_noise.paper(), {"ldp_epsilon": 8.0, "ldp_delta": 1e-5}, 1.0, 0.75), None, True),
    "pipeline-topksdp": (lambda _: recipes.from_config(TOPKSDP).client_pipeline(), None, True),
    "pipeline-paper": (lambda _: recipes.from_config(PAPER).client_pipeline(), None, True),
}


def an_upload(seed, sent=None):
  values = np.random.default_rng(seed).normal(size=D).astype(np.float32)
  sent = np.ones(D, bool) if sent is None else sent
  return pl.Upload(jnp.asarray(np.where(sent, values, 0.0)), jnp.asarray(sent))


def a_stage_context(seed, n=7):
  public = np.random.default_rng(100 + seed).normal(size=D).astype(np.float32)
  return pl.StageContext(key(seed), jnp.int32(n), jnp.float32(0.1), jnp.asarray(public))


def some_state(state0, seed):
  """A state as after a few rounds: residuals nonzero."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: jnp.asarray(0.3 * rng.normal(size=a.shape), a.dtype), state0)


@pytest.mark.parametrize("name", sorted(CLIENT_STAGES))
def test_client_stage_contract(name):
  make, number, draws = CLIENT_STAGES[name]
  stage = make(number)
  state0 = stage.init(D)
  state, up, ctx = some_state(state0, 1), an_upload(0), a_stage_context(0)
  (out, new_state, metrics), update = jit_matches_eager(stage.update, up, state, ctx)
  assert isinstance(metrics, dict) and all(jnp.shape(v) == () for v in metrics.values())
  assert out.values.shape == (D,) and out.values.dtype == jnp.float32
  assert out.sent.shape == (D,) and out.sent.dtype == jnp.bool_
  assert jnp.shape(out.noise_std) == ()
  same_structure(new_state, state0)
  # the Upload contract: values are zero off the sent coordinates (noise included)
  assert not np.any(np.asarray(out.values)[~np.asarray(out.sent)])
  # a stage never sends what came in unsent (zero-valued: the contract above)
  sparse = np.arange(D) % 3 != 0
  out_sparse, _, _ = update(an_upload(0, sparse), state, ctx)
  assert not np.any(np.asarray(out_sparse.sent)[~sparse])

  # vmap over a cohort's clients (the client phase maps a stage over its slots) equals
  # one call each; the same upload and state with each client's own key
  ctxs = stack([a_stage_context(s, n=5 + s) for s in (3, 4, 5)])
  states = stack([state] * 3)
  ups = stack([up] * 3)
  batched = jax.jit(jax.vmap(stage.update))(ups, states, ctxs)
  for i in range(3):
    assert_trees_close(row(batched, i), update(up, state, row(ctxs, i)))
  if draws:   # contract 4: two clients' draws (and two rounds' keys) differ
    values = np.asarray(batched[0].values)
    assert not np.allclose(values[0], values[1]) and not np.allclose(values[1], values[2])
    again, _, _ = update(up, state, ctx._replace(key=key(1)))
    assert trees_differ(again, out)

  if number is not None:   # contract 5: its number traced, vmapped over replicas
    vmap_matches_loop(lambda x: make(x).update(up, state, ctx), jnp.float32(number))


def test_chain_gives_each_stage_its_own_key():
  """A spy stage returns its key as its state: three in a chain get three keys, none
  the client's own; two noise stages in a chain draw two different noises."""
  spy = pl.ClientStage(lambda d: jnp.zeros((2,), jnp.uint32),
                       lambda u, s, ctx: (u, ctx.key, {}))
  chained = pl.chain(spy, spy, spy)
  ctx = a_stage_context(0)
  _, keys, _ = chained.update(an_upload(0), chained.init(D), ctx)
  seen = {tuple(np.asarray(k).tolist()) for k in (*keys, ctx.key)}
  assert len(seen) == 4
  noise = pl.gaussian_on_kept(lambda ctx: jnp.float32(1.0))
  zero = pl.Upload(jnp.zeros(D), jnp.ones(D, bool))
  one, _, _ = pl.chain(noise).update(zero, ((),), ctx)
  two, _, _ = pl.chain(noise, noise).update(zero, ((), ()), ctx)
  # with one key reused, the second noise would equal the first: two = 2 * one
  assert not np.allclose(two.values, 2 * one.values)


def test_topk_after_a_sparse_upload_keeps_values_zero_off_sent():
  stage = pl.topk_with_error_feedback(0.5)
  sparse = np.arange(D) % 2 == 0
  residual = jnp.asarray(np.where(sparse, 0.0, 10.0), jnp.float32)   # large where unsent
  out, _, _ = stage.update(an_upload(0, sparse), residual, a_stage_context(0))
  assert not np.any(np.asarray(out.values)[~np.asarray(out.sent)])


# ------------------------------------------------------------------ Byzantine attacks
@pytest.mark.parametrize("kind", attacks.ATTACKS)
def test_attack_contract(kind):
  m = 5
  uploads = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(m, 3, 2)), jnp.float32),
             "b": jnp.ones((m, 2), jnp.float32)}
  bad = jnp.asarray([True, False, True, False, True])
  ids = jnp.asarray([4, 0, 2, 1, 3], jnp.int32)
  fn = lambda u, bad, ids, k: attacks.replace_uploads(u, bad, ids, k, kind, 10.0)
  out, fn = jit_matches_eager(fn, uploads, bad, ids, key(0))
  same_structure(out, uploads)
  # honest slots are passed through untouched
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(uploads)):
    np.testing.assert_array_equal(np.asarray(a)[~np.asarray(bad)], np.asarray(b)[~np.asarray(bad)])
  if kind == "gaussian":
    flat = lambda t, i: np.concatenate([np.ravel(np.asarray(a[i])) for a in jax.tree.leaves(t)])
    assert not np.allclose(flat(out, 0), flat(out, 2))          # two clients' draws differ
    other = fn(uploads, bad, ids, key(1))
    assert not np.allclose(flat(out, 0), flat(other, 0))        # two rounds' draws differ
    # the draw follows the client's id, not its slot
    moved = fn(row(uploads, jnp.asarray([2, 1, 0, 3, 4])), bad, ids[jnp.asarray([2, 1, 0, 3, 4])],
               key(0))
    np.testing.assert_allclose(flat(moved, 0), flat(out, 2), rtol=1e-6)


# ------------------------------------------------------------------ server stages
N, SLOTS = 6, 4
SERVER_PARAMS = {"b": jnp.zeros((4,), jnp.float32), "w": jnp.zeros((3, 4), jnp.float32)}
SD = 16
IDS = jnp.asarray([4, 1, 0, 0], jnp.int32)     # slots 2, 3 padded: id 0, not a participant
MASK = jnp.asarray([True, True, False, False])
BASE = {"num_clients": N, "clients_per_round": SLOTS, "hidden": [4]}


@functools.lru_cache(maxsize=None)
def dp_setup(**overrides):
  """(cfg, model, privacy, hp as jnp arrays) for BASE + overrides."""
  cfg = make_config({**BASE, **overrides})
  model = make_model(cfg.model, (5,), 3, cfg.hidden)
  privacy = make_privacy(cfg, model)
  hp = jax.tree.map(jnp.asarray, hparams_lib.round_hparams(cfg, privacy))
  return cfg, model, privacy, hp


def controller_case(schedule, measure):
  # (weighted needs tiers' data; it reads the same numbers as convergence)
  cfg, _, _, hp = dp_setup(dp="local", noise_multiplier=1.0, noise_schedule=(
      "convergence" if schedule == "weighted" else schedule))
  return ss.noise_controller(schedule, measure, 3, N), hp


def chain_case():
  cfg, _, _, hp = dp_setup(dp="local", noise_multiplier=1.0, noise_schedule="convergence",
                           s_local=0.5, s_global=0.5, index_selection="public_topk",
                           aggregator="cluster", cluster_noise="equalize")
  return recipes.from_config(cfg).server_stages(cfg.num_clients, sim_lib.DOWNLINK), hp


# name -> () -> (ServerStage, hp)
SERVER_STAGES = {
    "downlink_topk": lambda: (ss.downlink_topk(0.5, sim_lib.DOWNLINK, "exact"), {}),
    "downlink_topk-bisect": lambda: (ss.downlink_topk(0.5, sim_lib.DOWNLINK, "bisect"), {}),
    "public_update": lambda: (ss.public_update(), {}),
    "noise_controller-static": lambda: controller_case("static", "update_diff"),
    "noise_controller-convergence": lambda: controller_case("convergence", "update_diff"),
    "noise_controller-weighted-norm_diff": lambda: controller_case("weighted", "norm_diff"),
    "chain-all": chain_case,
}


def a_delta(seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
                      SERVER_PARAMS)


def a_round_context(hp, seed=0, ids=IDS, mask=MASK, skipped=False, applied=True):
  participants = jnp.sum(mask, dtype=jnp.int32)
  return ss.RoundContext(key(seed), hp, ids, mask, participants, jnp.bool_(skipped),
                         jnp.bool_(applied))


def some_server_state(state0, seed):
  """A server state as after a few rounds (floats random, counts small)."""
  rng = np.random.default_rng(seed)
  def one(a):
    if jnp.issubdtype(a.dtype, jnp.integer):
      return jnp.asarray(rng.integers(1, 4, size=a.shape), a.dtype)
    return jnp.asarray(np.abs(rng.normal(size=a.shape)) * 0.5, a.dtype)
  return jax.tree.map(one, state0)


def client_rows(state):
  """The leaves with a [num_clients] leading axis (per-client rows)."""
  return [a for a in jax.tree.leaves(state) if jnp.ndim(a) >= 1 and a.shape[0] == N]


@pytest.mark.parametrize("name", sorted(SERVER_STAGES))
def test_server_stage_contract(name):
  stage, hp = SERVER_STAGES[name]()
  state0 = stage.init(SERVER_PARAMS, SD)
  state, delta = some_server_state(state0, 1), a_delta(0)
  ctx = a_round_context(hp)
  (new_delta, new_state, metrics), update = jit_matches_eager(stage.update, delta, state, ctx)
  assert isinstance(metrics, dict)
  same_structure(new_delta, SERVER_PARAMS)
  same_structure(new_state, state0)
  # fed back, the state keeps its structure (a fixed lax.scan carry)
  same_structure(update(new_delta, new_state, a_round_context(hp, 1))[1], state0)

  # masked slots: other ids there change nothing, and no client that did not take
  # part has its row written (padded slots carry a real id, 0)
  garbage = a_round_context(hp, ids=jnp.asarray([4, 1, 5, 2], jnp.int32))
  assert_trees_close(update(delta, state, garbage)[:2], (new_delta, new_state))
  took_part = np.zeros(N, bool)
  took_part[np.asarray(IDS)[np.asarray(MASK)]] = True
  for before, after in zip(client_rows(state), client_rows(new_state)):
    np.testing.assert_array_equal(np.asarray(after)[~took_part], np.asarray(before)[~took_part])

  # a round nobody took part in, skipped and not applied, observes nothing: only
  # the per-round counters may move
  nobody = a_round_context(hp, mask=jnp.zeros(SLOTS, bool), skipped=True, applied=False)
  _, kept, _ = update(delta, state, nobody)
  moves = {"skipped", "paper_epsilon_rounds"}
  flat_kept = jax.tree_util.tree_flatten_with_path(kept)[0]
  for (path, a), b in zip(flat_kept, jax.tree.leaves(state)):
    if not moves & {getattr(k, "key", None) for k in path}:
      np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))

  if hp:   # contract 5: the stage vmapped over replicas of the round's hyperparameters
    vmap_matches_loop(lambda h: update(delta, state, ctx._replace(hp=h)), hp)


def test_public_update_keeps_the_last_released_update_through_an_unapplied_round():
  stage = ss.public_update()
  before = jnp.arange(SD, dtype=jnp.float32)
  nobody = a_round_context({}, mask=jnp.zeros(SLOTS, bool), applied=False)
  _, after, _ = stage.update(a_delta(0), before, nobody)
  np.testing.assert_array_equal(after, before)


def test_layerwise_shuffle_draws_a_permutation_per_layer_and_round():
  m = 16
  uploads = {"a": jnp.arange(m, dtype=jnp.float32), "b": jnp.arange(m, dtype=jnp.float32)}
  out, shuffle = jit_matches_eager(pl.layerwise_shuffle, uploads, key(0))
  same_structure(out, uploads)
  assert sorted(np.asarray(out["a"]).tolist()) == list(range(m))
  # one key per layer: two equal layers get different permutations (1 / 16! by chance)
  assert not np.array_equal(out["a"], out["b"])
  assert not np.array_equal(shuffle(uploads, key(1))["a"], out["a"])


# ------------------------------------------------------------------ DP's round functions
class DPState(NamedTuple):
  """The SimState fields the DP round functions read."""
  privacy: Any        # the mechanism's slot: PrivacyState(ledger, clip_norm)
  server_state: Any


# each feature once (a case per feature compiled the same mechanism again: seconds each)
DP_CASES = {
    "none": {},
    "central": dict(dp="central", noise_multiplier=1.0),
    "central-per_layer-adaptive": dict(dp="central", noise_multiplier=1.0, clip_parts="per_layer",
                                       adaptive_clipping=True),
    # (a round past the target is skipped in the round only under a schedule or tiers)
    "central-budget-convergence": dict(dp="central", noise_multiplier=1.0, target_epsilon=30.0,
                                       noise_schedule="convergence"),
    "local": dict(dp="local", noise_multiplier=1.0),
    "local-per_layer-budget-convergence": dict(dp="local", noise_multiplier=1.0,
                                               clip_parts="per_layer", target_epsilon=30.0,
                                               noise_schedule="convergence"),
    "local-cluster_noise": dict(dp="local", noise_multiplier=1.0, aggregator="cluster",
                                cluster_noise="equalize"),
}
# slots 2, 3 padded; they carry id 0, as client 0 in slot 1 (a padded write must not
# win over the participant's)
DP_IDS = jnp.asarray([4, 0, 0, 0], jnp.int32)
DP_MASK = jnp.asarray([True, True, False, False])
SPENT = 3   # local budgets: client 3 has spent its budget


def dp_case(name):
  cfg, model, privacy, hp = dp_setup(**DP_CASES[name])
  recipe = recipes.from_config(cfg)
  dp = dp_round_lib.make_dp_round(privacy, N, cfg.clients_per_round, recipe.rule.client_noise,
                                  sim_lib.SERVER_NOISE, sim_lib.CLIP_COUNT_NOISE,
                                  sim_lib.LOCAL_NOISE)
  params = model.init(key(0))
  d = sum(a.size for a in jax.tree.leaves(params))
  server_state = recipe.server_stages(cfg.num_clients, sim_lib.DOWNLINK).init(params, d)
  if recipe.rule.stateful:   # the cluster rule's sizes under per-cluster noise
    server_state["aggregator"] = recipe.rule.init(d, N)
  server_state = some_server_state(server_state, 2)
  if "noise_control" in server_state:
    server_state["noise_control"]["score"] = jnp.float32(0.4)
  orders = len(hp["event_rdp"]) if "event_rdp" in hp else 1
  ledger = jnp.zeros((N, orders) if privacy.mode == "local" else (orders,), jnp.float32)
  if privacy.mode == "local":   # a few participations each; client SPENT far past any budget
    ledger = ledger + 2.0 * hp["event_rdp"]
    ledger = ledger.at[SPENT].set(1e4 * hp["event_rdp"])
  state = DPState(PrivacyState(ledger, jnp.float32(0.8)), server_state)
  return cfg, privacy, dp, params, state, hp


def cohort_deltas(params, garbage=0.0, same=False):
  """[SLOTS] deltas: slot 1 the same as slot 0 when `same`; masked slots `garbage`."""
  rng = np.random.default_rng(0)
  def one(a):
    x = rng.normal(size=(SLOTS,) + a.shape).astype(np.float32)
    if same:
      x[1] = x[0]
    x[~np.asarray(DP_MASK)] = garbage
    return jnp.asarray(x)
  return jax.tree.map(one, params)


def dp_step(dp, state, ids, mask, deltas, round_key, hp, mode="central"):
  """The DP functions in the round's order, on one cohort."""
  plan = dp.plan(state, hp)
  adm = dp.admit(state, ids, mask, plan, hp)
  clip = dp.clip_norm(state, hp)
  if mode == "none":   # the round runs no client half without DP
    uploads, unclipped, nonfinite = deltas, jnp.int32(0), jnp.zeros(ids.shape, bool)
  else:
    # the client half is per upload: the round runs it in its client loop or vmapped
    uploads, norms = jax.vmap(lambda u, c: dp.client(u, c, round_key, clip, hp, plan.scales,
                                                     adm.factor[c]))(deltas, ids)
    unclipped = jnp.sum((norms <= clip) & adm.mask, dtype=jnp.int32)
    nonfinite = ~jnp.isfinite(norms) & adm.mask
  # (the round's own sums are tested with the round; here only admitted slots enter)
  total = jax.tree.map(lambda u: jnp.sum(jnp.where(
      adm.mask.reshape((-1,) + (1,) * (u.ndim - 1)), u, 0.0), axis=0), uploads)
  delta, slot, event = dp.release(total, state, plan, adm, ids,
                                  jnp.sum(adm.mask, dtype=jnp.int32), unclipped, round_key,
                                  clip, hp)
  return plan, adm, (uploads, unclipped, nonfinite), (delta, slot.ledger, slot.clip_norm, event)


# `make test` runs each mode, clip layout and budget once; local DP's per-layer budget
# case runs in `make test-slow` (CI runs both)
@pytest.mark.parametrize("name", make_test_runs(sorted(DP_CASES), {
    "none", "central", "local", "central-per_layer-adaptive", "central-budget-convergence",
    "local-cluster_noise"}))
def test_dp_round_contract(name):
  cfg, privacy, dp, params, state, hp = dp_case(name)
  ids, mask = DP_IDS, DP_MASK
  budgets = privacy.mode == "local" and privacy.target_epsilon is not None
  if budgets:   # a participant whose budget is spent is refused
    ids = ids.at[1].set(SPENT)
  step = lambda deltas, k, hp, ids: dp_step(dp, state, ids, mask, deltas, k, hp, privacy.mode)
  deltas = cohort_deltas(params)
  out, step = jit_matches_eager(step, deltas, key(0), hp, ids)
  plan, adm, (uploads, unclipped, nonfinite), (released, ledger, clip, event) = out
  parts = len(privacy.layout.fractions) if privacy.layout else 1
  assert plan.scales.shape == (parts,) and plan.scales.dtype == jnp.float32
  assert adm.mask.shape == (SLOTS,) and adm.mask.dtype == jnp.bool_
  assert adm.factor.shape == (N,) and adm.factor.dtype == jnp.float32
  same_structure(uploads, deltas)
  assert unclipped.shape == () and unclipped.dtype == jnp.int32
  assert nonfinite.shape == (SLOTS,) and nonfinite.dtype == jnp.bool_
  same_structure(released, params)
  same_structure(ledger, state.privacy.ledger)
  assert clip.shape == () and clip.dtype == jnp.float32
  assert event.shape == () and event.dtype == jnp.int32

  # admission only ever removes slots
  admitted = np.asarray(adm.mask)
  assert not np.any(admitted & ~np.asarray(mask))
  if budgets:
    np.testing.assert_array_equal(admitted, [True, False, False, False])

  # masked slots' uploads (zeros, huge, NaN) change nothing of the participants'
  for garbage in (1e6, np.nan):
    again = step(cohort_deltas(params, garbage), key(0), hp, ids)
    assert_trees_close(jax.tree.map(lambda u: u[admitted], again[2][0]),
                       jax.tree.map(lambda u: u[admitted], uploads))
    assert_trees_close(again[2][1:], out[2][1:])    # unclipped count, non-finite flags
    assert_trees_close(again[3], out[3])            # release: delta, ledger, clip, event
  if privacy.mode == "local":   # only admitted clients' ledgers are written
    written = np.zeros(N, bool)
    written[np.asarray(ids)[admitted]] = True
    np.testing.assert_array_equal(np.asarray(ledger)[~written],
                                  np.asarray(state.privacy.ledger)[~written])
    assert np.all(np.asarray(ledger)[written] > np.asarray(state.privacy.ledger)[written])

  # contract 4: local noise per client (two equal deltas get different noise), from
  # the client's id whatever its slot; central noise per round
  if privacy.mode == "local":
    both = step(cohort_deltas(params, same=True), key(0), hp, ids)[2][0]
    if admitted[0] and admitted[1]:
      assert trees_differ(row(both, 0), row(both, 1))
    swap = jnp.asarray([1, 0, 2, 3])
    swapped = step(row(deltas, swap), key(0), hp, ids[swap])[2][0]
    if admitted[0]:
      assert_trees_close(row(swapped, 1), row(uploads, 0))
    assert trees_differ(row(step(deltas, key(1), hp, ids)[2][0], 0), row(uploads, 0))
  if privacy.mode == "central":
    assert trees_differ(step(deltas, key(1), hp, ids)[3][0], released)

  # contract 5: vmapped over replicas of the round's hyperparameters
  vmap_matches_loop(lambda h: step(deltas, key(0), h, ids), hp)


def test_central_budget_skips_a_round_past_the_target_and_writes_nothing():
  _, privacy, dp, params, state, hp = dp_case("central-budget-convergence")
  state = state._replace(privacy=state.privacy._replace(ledger=1e4 * hp["event_rdp"]))
  plan, adm, _, (released, ledger, clip, event) = dp_step(
      dp, state, DP_IDS, DP_MASK, cohort_deltas(params), key(0), hp)
  assert bool(adm.skip) and not np.any(adm.mask) and int(adm.spent) == 1
  np.testing.assert_array_equal(ledger, state.privacy.ledger)
  assert int(event) == -1


def test_round_purpose_tags_are_distinct():
  tags = {t: getattr(sim_lib, t) for t in (
      "COHORT_SAMPLING", "CLIENT_TRAINING", "SERVER_NOISE", "LOCAL_NOISE", "CLIP_COUNT_NOISE",
      "PIPELINE", "SHUFFLE", "KEPT_NOISE", "DOWNLINK", "BYZANTINE", "MODEL_INIT")}
  assert len(set(tags.values())) == len(tags), tags


DRAWS = ("normal", "uniform", "bernoulli", "permutation", "randint", "choice", "split", "bits")


def test_no_two_draws_in_a_round_share_a_key(monkeypatch):
  """Every jax.random draw the stages make in one round, recorded by a spy: central
  noise (each leaf), adaptive clipping's count noise, local noise (each client and
  leaf), kept noise, random-k, a sampling top-k kernel, the downlink, attacks and
  the cohort draw. No key is drawn from twice, nor is a key drawn from that also
  seeds others (fold_in), nor one the round hands a purpose that derives its own
  (client training)."""
  used, parents = [], set()

  def record(into):
    def callback(k):
      rows = [tuple(r) for r in np.asarray(k).reshape(-1, 2).tolist()]
      into.extend(rows) if isinstance(into, list) else into.update(rows)
    return callback

  for fn in DRAWS + ("fold_in",):
    original = getattr(jax.random, fn)
    def spy(k, *args, _original=original, _into=parents if fn == "fold_in" else used, **kwargs):
      jax.debug.callback(record(_into), k)
      return _original(k, *args, **kwargs)
    monkeypatch.setattr(jax.random, fn, spy)

  round_key = key(11)
  tag = lambda t: jax.random.fold_in(round_key, t)
  m = 3
  ids, mask = jnp.asarray([2, 0, 5], jnp.int32), jnp.ones(m, bool)
  # the cohort draw
  sample_cohort(tag(sim_lib.COHORT_SAMPLING), N, m, "fixed", m)
  # the client pipeline of each client, from its own key (as the client phase derives it)
  pipe = recipes.from_config(TOPKSDP).client_pipeline()
  for c in np.asarray(ids):
    ctx = a_stage_context(0)._replace(key=jax.random.fold_in(tag(sim_lib.PIPELINE), c))
    pipe.update(an_upload(int(c)), pipe.init(D), ctx)
  # central DP with adaptive clipping: the update noise and the count noise
  _, _, dp, params, state, hp = dp_case("central-per_layer-adaptive")
  deltas = jax.tree.map(lambda a: jnp.ones((m,) + a.shape), params)
  dp_step(dp, state, ids, mask, deltas, round_key, hp)
  # local DP's noise, each client and leaf
  _, _, dp, _, state, hp = dp_case("local")
  dp_step(dp, state, ids, mask, deltas, round_key, hp)
  # server stages (the downlink with a sampling kernel) and the attacks
  down = ss.downlink_topk(0.5, sim_lib.DOWNLINK, "bisect")
  down.update(a_delta(0), jnp.zeros(SD), a_round_context({}, seed=11))
  attacks.replace_uploads(deltas, mask, ids, tag(sim_lib.BYZANTINE), "gaussian", 1.0)
  jax.effects_barrier()

  assert len(used) > 10
  repeated = {k for k in used if used.count(k) > 1}
  assert not repeated, f"{len(repeated)} keys drawn from twice"
  assert not parents & set(used), "a key drawn from also seeds other keys"
  training = {tuple(np.asarray(jax.random.fold_in(tag(sim_lib.CLIENT_TRAINING), c)).tolist())
              for c in range(N)}
  assert not training & set(used)
