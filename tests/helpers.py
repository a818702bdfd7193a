"""Small in-memory problems shared by the tests, and which cases `make test` runs."""

import contextlib
import os
import sys

import jax
import numpy as np
import pytest

from fedjax_dp import make_config
from fedjax_dp.models import make_model
from fedjax_dp.core.build import build_simulation
from fedjax_dp.recipes.plan import plan_run
from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.placement.host import _FLAG as DEVICE_COUNT_FLAG
from fedjax_dp.placement.store import build_store


def objective_of(names, cfg):
  """The objective of the local terms `names` (registry order), each built from cfg's
  keys as recipes.from_config builds it, with cfg's client momentum."""
  from fedjax_dp.algorithms import TERMS, of_terms
  from fedjax_dp.recipes.flat import build_stage
  return of_terms([build_stage("term", n, cfg) for n in TERMS if n in names], cfg.momentum)


def toy_problem(sizes=(7, 12, 3), features=6, classes=3, seed=0):
  """Random features, labels and a partition with the given client sizes."""
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  x = rng.normal(size=(n, features)).astype(np.float32)
  y = rng.integers(0, classes, size=n).astype(np.int32)
  perm = rng.permutation(n)
  parts, start = [], 0
  for s in sizes:
    parts.append(perm[start:start + s])
    start += s
  return x, y, parts


def toy_simulation(x, y, parts, devices=1, classes=3, feature_tiers=None, resident_state=None,
                   poisoned_offset=None, task=None, **overrides):
  values = dict(num_clients=len(parts), clients_per_round=len(parts), hidden=[5],
                batch_size=4, local_epochs=2, lr=0.1, momentum=0.5, devices=devices)
  values.update(overrides)
  cfg = make_config(values)
  model = make_model(cfg.model, x.shape[1:], classes, cfg.hidden)
  store = build_store(x, y, parts, pad_to_multiple=cfg.batch_size,
                      y_dtype=task.target_dtype if task else None)
  return build_simulation(plan_run(cfg, model, feature_tiers), model, store, make_mesh(devices),
                          resident_state=resident_state, poisoned_offset=poisoned_offset,
                          **({"task": task} if task else {}))


def keyed_state(sim, key=None):
  """sim's round-0 state with the run key `key` (default PRNGKey(0)), replicated: for
  tests that compare two configs' rounds on the same draws, which their own keys
  would not be (recipes/release_identity.py: releases that differ draw afresh)."""
  import jax
  key = jax.random.PRNGKey(0) if key is None else key
  return sim.replicate(sim.init_state()._replace(key=np.asarray(key)))


def round_zero_deltas(sim, state):
  """Each client's local-training delta in round 0, computed outside the round
  (the same local_train and keys), as a list of param pytrees of numpy arrays."""
  import jax
  from functools import partial
  from fedjax_dp.training import client as client_lib
  from fedjax_dp.core.state import CLIENT_TRAINING
  cfg = sim.cfg
  train = jax.jit(partial(client_lib.local_train, apply_fn=sim.model.apply, epochs=cfg.local_epochs,
                          batch_size=cfg.batch_size, momentum=cfg.momentum))
  client_key = jax.random.fold_in(jax.random.fold_in(state.key, 0), CLIENT_TRAINING)
  out = []
  for c in range(cfg.num_clients):
    res = train(state.params, sim.store.client_index[c], sim.store.client_count[c],
                jax.random.fold_in(client_key, c), np.float32(cfg.lr), x=sim.store.x,
                y=sim.store.y)
    out.append(jax.tree.map(np.asarray, res.delta))
  return out


def flat(tree):
  import jax
  return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(tree)])


def make_test_runs(values, keep):
  """Parametrize values: those in `keep` run in `make test`; the others are marked
  slow and run in `make test-slow` (CI runs both). For the cases of one test that
  take the same code paths with other settings: `make test` keeps one of each path."""
  unknown = set(keep) - set(values)
  assert not unknown, f"make_test_runs: {sorted(unknown)} are not among the values"
  # a tuple is one case of several argument names
  return [v if v in keep else
          pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
          for v in values]


def covering_array(combos: list[tuple], groups: list[tuple[int, ...]]) -> list[tuple]:
  """The combos a greedy cover picks (in the order picked; deterministic) so that, for
  every group of axis positions, every combination of values that some combo of
  `combos` has at those positions is in a picked one. With every pair of axes among
  the groups, each pair of settings runs together at least once."""
  def parts(c):
    return {(g, tuple(c[i] for i in g)) for g in groups}
  need = set().union(*(parts(c) for c in combos))
  picked = []
  while need:
    best = max(combos, key=lambda c: len(parts(c) & need))
    picked.append(best)
    need -= parts(best)
  return picked


def pairs_and(axes: int, *triples: tuple[int, ...]) -> list[tuple[int, ...]]:
  """Every pair of `axes` axis positions, and the given larger groups."""
  import itertools
  return list(itertools.combinations(range(axes), 2)) + list(triples)


def grid_runs(values, keep, ci):
  """Parametrize a grid's values: those in `keep` run in `make test`, those in `ci` (a
  covering array of the grid) in `make test-slow`, which CI runs; the whole grid in
  `make test-long` (marker long), which CI does not (its runs did not fit CI's 90
  minutes beside the rest)."""
  unknown = set(ci) - set(values)
  assert not unknown, f"grid_runs: {sorted(unknown)} are not among the values"
  return [v if v in keep else
          pytest.param(v, marks=(pytest.mark.slow,) if v in ci else
                       (pytest.mark.slow, pytest.mark.long))
          for v in values]


def is_sweep_file(path: str) -> bool:
  """A sweep file (fedjax-dp sweep: base, grid, variants, seeds), not a config."""
  import yaml
  from fedjax_dp.sweeps.spec import SWEEP_KEYS
  with open(path) as f:
    loaded = yaml.safe_load(f) or {}
  return bool(set(loaded) & set(SWEEP_KEYS) - {"config"})



def experiment_script(name: str):
  """experiments/<name>/run.py, imported as a module (its functions, no run)."""
  import importlib.util
  import os
  path = os.path.join(os.path.dirname(__file__), "..", "experiments", name, "run.py")
  spec = importlib.util.spec_from_file_location(f"{name}_run", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def cpu_devices_env(count: int, **extra: str) -> dict:
  """The environment for a subprocess on `count` CPU devices, asked as a user asks
  (FEDJAX_DP_CPU_DEVICES), with conftest's XLA_FLAGS device count (8) taken out: the
  two may not disagree (host.py refuses), and a command that sets the variable itself
  (the README's `FEDJAX_DP_CPU_DEVICES=1 ...`) then gets what it asks for."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(DEVICE_COUNT_FLAG)]
  return dict(os.environ, XLA_FLAGS=" ".join(flags), FEDJAX_DP_CPU_DEVICES=str(count), **extra)


def one_device_env() -> dict:
  """cpu_devices_env(1). On conftest's 8 devices a partial cohort's per-client table
  is held once per device: TopkSDP-FL on CIFAR-10's CNN took 8 x 1.6 GB and was
  killed in CI."""
  return cpu_devices_env(1)


@contextlib.contextmanager
def registries_restored():
  """Within, what plugins register (terms, rules, mechanisms, datasets, plugins' keys)
  and the plugin modules they were imported as; afterwards all as they were (other
  tests in this process read the registries, and a plugin file imported again would
  register its names a second time)."""
  from fedjax_dp.algorithms import registry as term_registry
  from fedjax_dp.config import plugin_keys
  from fedjax_dp.data import registry as data_registry
  from fedjax_dp.privacy import mechanisms
  from fedjax_dp.robust import registry as rule_registry
  registries = (term_registry.TERMS, term_registry.ALGORITHMS, rule_registry.AGGREGATORS,
                mechanisms.MECHANISMS, mechanisms.KEPT_NOISE, data_registry.DATASETS,
                plugin_keys.PLUGIN_KEYS)
  saved = [dict(r) for r in registries]
  modules = set(sys.modules)
  try:
    yield
  finally:
    for registry, before in zip(registries, saved):
      registry.clear()
      registry.update(before)
    for name in set(sys.modules) - modules:
      if name.startswith("fedjax_dp_plugin_"):
        del sys.modules[name]


def run_params(sim, rounds, state=None):
  """(the params after `rounds` rounds as numpy arrays, the rounds' stats); from
  `state` on the same draws where given."""
  if state is None:
    state, stats = sim.run_rounds(sim.init_state(), rounds)
  else:   # a measurement on the same draws (the differential method), not a release
    state, stats = sim.run_rounds(state, rounds, same_draws=True)
  return [np.asarray(a) for a in jax.tree.leaves(state.params)], stats


def assert_same_as_loop(fast, loop, path="one_step", rounds=3):
  """`fast` (on `path`) runs the rounds of `loop` (the per-client loop) to float
  summation order: the params, the loss, the counts and the stages' metrics."""
  assert (fast.client_parallelism, loop.client_parallelism) == (path, "map")
  (a, sa), (b, sb) = run_params(fast, rounds), run_params(loop, rounds)
  for u, v in zip(a, b):
    np.testing.assert_allclose(u, v, atol=2e-6, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(sa.loss_sum), np.asarray(sb.loss_sum), rtol=1e-5)
  for field in ("examples", "participants", "nonfinite"):
    np.testing.assert_array_equal(np.asarray(getattr(sa, field)), np.asarray(getattr(sb, field)))
  jax.tree.map(np.testing.assert_array_equal, sa.metrics, sb.metrics)
  return sa
