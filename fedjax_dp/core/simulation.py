"""One round is one compiled program; rounds between evaluations are one `lax.scan`.

`build_simulation` (core/build.py) resolves the stages of a run once (the privacy mechanism, the
client stages, the aggregator, the server stages, the server optimizer and the
executor that runs the clients) and compiles the round (core/round.py), which reads
no config:

  planner -> cohort sampling -> admission -> client phase (local training, upload
  stages, the mechanism's client half, attacks, aggregation; core/client_phase.py)
  -> the terms' server step -> release (central noise, the accountant's ledger)
  -> the terms' server update -> server stages -> server optimizer.

The cohort axis is sharded over the `clients` mesh axis with `shard_map`; the
same code runs on one device (a mesh of one) and on many. Keys: see
core/state.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp.errors import ConfigError
from fedjax_dp.recipes import hparams as hparams_lib
from fedjax_dp.recipes import plan as plan_lib
from fedjax_dp.core.state import RoundStats, SimState, init_state, secret_run_key
from fedjax_dp.models import Model
from fedjax_dp.placement import paged_state
from fedjax_dp.placement.store import FederatedStore
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import noise_control
from fedjax_dp.recipes import release_identity
from fedjax_dp.privacy.setup import Privacy


def release_of_numbers(hparams: dict, plan: plan_lib.RunPlan) -> tuple:
  """The key of Simulation.issued: the numbers' digest and the seed of the plan they
  are run at (with_seed keeps the numbers: the seed tells their releases apart)."""
  return hparams_lib.digest(hparams), plan.setup.seed


def make_mesh(num_devices: int = 0) -> Mesh:
  """A 1-D mesh named `clients` over the first `num_devices` devices (0 = all)."""
  devices = jax.devices()
  if num_devices:
    if num_devices > len(devices):
      raise ConfigError(f"config key 'devices' = {num_devices}: this machine has "
                        f"{len(devices)}; allowed are 0 (all) to {len(devices)}")
    if jax.process_count() > 1 and num_devices != len(devices):
      raise ConfigError(f"config key 'devices' = {num_devices} with {jax.process_count()} "
                        f"processes: the clients axis spans every process's devices; allowed "
                        f"are 0 (all) and {len(devices)}")
    devices = devices[:num_devices]
  return Mesh(np.array(devices), ("clients",))


@dataclasses.dataclass(frozen=True)
class Simulation:
  """A compiled federated simulation: build with `build_simulation`."""
  plan: plan_lib.RunPlan      # the settings read once (recipes/plan.py): recipe, set-up, privacy
  model: Model
  store: FederatedStore
  mesh: Mesh
  cohort_capacity: int        # cohort slots per round, padded to a multiple of the mesh size
  client_parallelism: str     # 'map' or 'vmap', resolved from 'auto'
  run_chunk: Callable         # (working state, store, hparams, length) -> (state, RoundStats [length])
  evaluate: Callable          # (params, x, y, mask) -> {metric name: mean over the test set, a float}
  hparams: Any = None         # the round's numeric hyperparameters (hparams.py), replicated
  analysis: Any = None        # the sensitivity analyzer's report (tier_source 'analyzer')
  # client order <-> the layout the compiled rounds keep the per-client state in
  # (identity but with resident state or a sharded table; see build_simulation)
  to_working: Callable = lambda state: state
  to_client_order: Callable = lambda state: state
  # (digest of a hyperparameter pytree this simulation or a copy made, the seed it was
  # made at) -> the settings it stands for (run_rounds refuses others: an edited pytree
  # could change the noise applied but not the RDP charged; init_state(hparams) takes
  # the run key of that release; with_seed keeps the numbers, so the seed tells apart
  # the releases of one pytree)
  issued: dict = dataclasses.field(default_factory=dict)
  _privacy_cache: dict = dataclasses.field(default_factory=dict)   # recipes/plan.replan's
  # the test set in evaluation batches (batch_for_eval), set by runner.setup:
  # sim.evaluate(state.params, *sim.test_data)
  test_data: Any = None
  # a data attack's test set (adversary/poisoning.py): (metric name, evaluation batches)
  attack_data: Any = None
  paging: paged_state.Paging | None = None   # client_state_store host/disk (paged_state.py)
  # run_chunk vmapped over stacked replicas: ([R] states, store, [R] hparams, length)
  run_replica_chunk: Callable | None = None
  # the release's inputs (data, own model and loss, tiers, budgets): with the config,
  # the run key's identity (recipes/release_identity.py)
  inputs_digest: str = ""
  sampler: Any = None         # the cohort sampler (placement/cohort.Sampler): its init state

  # the plan's parts, by the names the reports and callbacks read
  cfg = property(lambda self: self.plan.cfg, doc="The run's settings (config.json).")
  recipe = property(lambda self: self.plan.recipe, doc="The run's stages.")
  setup = property(lambda self: self.plan.setup, doc="Population, training, execution, adversary.")
  privacy = property(lambda self: self.plan.privacy, doc="The privacy set-up (privacy/setup.py).")
  feature_tiers = property(lambda self: self.plan.feature_tiers)
  calibrated = property(lambda self: self.plan.calibrated)

  @property
  def noise_multiplier(self) -> float:
    """The noise multiplier the accountant charges (configured or calibrated)."""
    return self.privacy.noise_multiplier

  def replicate(self, tree):
    """Places a pytree replicated on the mesh, as the compiled round returns it
    (so the first and later calls share one compilation)."""
    return jax.device_put(tree, NamedSharding(self.mesh, P()))

  def init_state(self, hparams: dict | None = None) -> SimState:
    """Round 0's state. The run key (cohorts, training, noise) is the release's:
    the seed with the digest of this simulation's settings and inputs folded in
    (recipes/release_identity.py), so that with_hparams or another config draws
    afresh. With noise_seed 'secret' it comes from the operating system's
    entropy: neither the seed nor config.json then tells the noise; the model's
    initialisation stays seeded.
    `hparams` (hparams_for): the run key of the release they stand for and the clip
    norm the run starts from."""
    cfg = self.cfg
    if hparams is not None:   # the release those numbers are (hparams_for's config)
      cfg = self._release_of(hparams)
      if cfg is None:
        raise ConfigError("init_state: these hyperparameters were not made by this "
                          "simulation's hparams_for or with_hparams (the run key is the "
                          "release's, and these name none)")
    key = (secret_run_key() if self.setup.noise_seed == "secret" else
           release_identity.run_key(cfg, self.inputs_digest))
    state = init_state(self.setup, self.recipe, self.model, key,
                       self.paging and self.paging.make_table, self.privacy,
                       self.sampler and self.sampler.init)
    if hparams is not None:
      state = state._replace(privacy=state.privacy._replace(
          clip_norm=jnp.asarray(hparams["clip_norm"], jnp.float32)))
    return self.replicate(state)

  def with_hparams(self, **overrides) -> "Simulation":
    """This simulation with config keys that are data changed (hparams.numeric_keys()):
    the same compiled round (no recompilation), the new settings, privacy set-up and
    hyperparameters, so that its init_state, epsilons, privacy log and report
    (privacy_report.privacy_report(sim.cfg, sim, state, log)) all follow the new
    values. Derived entries (the RDP a round is charged, budget limits) are
    recomputed with the config path's own functions (recipes/plan.replan): the
    ledger charges what the round applies. Structural changes, and keys that would
    change nothing in this round, are refused in one line."""
    plan = self._issue(overrides)
    return dataclasses.replace(self, plan=plan,
                               hparams=self.replicate(jax.tree.map(jnp.asarray, plan.hparams)))

  def with_seed(self, seed: int) -> "Simulation":
    """This simulation with another run key (config key `seed`: the model's
    initialisation, cohorts, local training, noise) on the same data: `data_seed`
    is pinned to the data this simulation was built from. The same compiled round."""
    plan = plan_lib.reseeded(self.plan, seed)
    self.issued[release_of_numbers(plan.hparams, plan)] = plan.cfg
    return dataclasses.replace(self, plan=plan)

  def run_replicas(self, states: SimState, hparams: dict, num_rounds: int):
    """num_rounds rounds of a batch of replicas in one compiled program: `states`
    and `hparams` stacked on a leading [replicas] axis (states in the working
    layout, donated; hparams as this simulation's or its with_hparams' `hparams`,
    stacked), each replica a run of its own (its own run key and numbers, no
    value shared). Returns (states, RoundStats [replicas, num_rounds]). The
    replicas ride along the cohort's sharding over "clients"; batched matmuls
    round apart from a single run's (about 1e-7 relative). Each replica's state
    must come from init_state(its hparams) (or with_hparams(...).init_state()):
    its release's key; a state of another release would share its draws
    (run_rounds checks this; here the stacked states are the caller's)."""
    if self.paging is not None:
      raise ConfigError("replicas of a run with client_state_store "
                        f"{self.setup.execution.client_state_store!r} cannot be batched: its "
                        "host table is paged round by round for one run; run them one at a "
                        "time (replica_batch 1)")
    self._check_strategy_rounds(states, num_rounds)
    return self.run_replica_chunk(states, self.store, hparams, num_rounds)

  def hparams_for(self, **overrides) -> dict:
    """`with_hparams(**overrides).hparams` as host arrays, for stacking replicas
    (`jax.vmap` over run_chunk) or run_rounds(hparams=...). A run's reports and
    privacy log must come from the matching `with_hparams` simulation."""
    return self._issue(overrides).hparams

  def _issue(self, overrides: dict) -> plan_lib.RunPlan:
    """The plan with `overrides`; its hyperparameters' digest is recorded, so that
    run_rounds accepts them."""
    plan = plan_lib.replan(self.plan, overrides, self.model, self._privacy_cache)
    self.issued[release_of_numbers(plan.hparams, plan)] = plan.cfg
    return plan

  def _release_of(self, hparams: dict):
    """The settings `hparams` stand for at this simulation's seed (None: not issued)."""
    return self.issued.get(release_of_numbers(hparams, self.plan))

  def privacy_for(self, **overrides) -> Privacy:
    """The privacy set-up with `overrides` (see with_hparams)."""
    return plan_lib.replan(self.plan, overrides, self.model, self._privacy_cache).privacy

  def epsilons(self, state: SimState):
    """(epsilon, optimal order) spent, by the in-round RDP ledger, as float64 numpy:
    scalars for central DP, [num_clients] arrays for local DP."""
    return accounting.epsilons_np(np.asarray(state.privacy.ledger, np.float64),
                                  self.privacy.delta)

  def next_event_rdp(self, state: SimState) -> np.ndarray:
    """float64 [orders] (or [num_clients, orders] with per-cluster noise): the RDP
    one participation in the next round costs (local DP)."""
    p = self.privacy
    if p.schedule == "static":
      event = np.asarray(p.event_rdp, np.float64)
    else:
      score = float(state.server_state["noise_control"]["score"])
      scales = np.asarray(noise_control.noise_scales(p.schedule, score, p.tier_scales(),
                                                     self._convergence_beta()), np.float64)
      event = noise_control.local_event_rdp_np(p.update_noise_multiplier, p.layout.fractions,
                                               scales)
    if self.recipe.rule.client_noise is not None:   # per-cluster noise: the rule's state
      f = np.asarray(self.recipe.rule.client_noise(state.server_state["aggregator"]),
                     np.float64)
      event = event[None, :] / f[:, None] ** 2
    return event

  def client_budgets(self) -> np.ndarray | None:
    """float64 [num_clients]: each client's target epsilon (None without a target)."""
    if self.privacy.client_budgets is not None:
      return self.privacy.client_budgets
    if self.privacy.target_epsilon is None:
      return None
    return np.full(self.setup.population.num_clients, self.privacy.target_epsilon)

  def _convergence_beta(self) -> float:
    return self.recipe.planner.config["convergence_beta"]

  def run_rounds(self, state: SimState, num_rounds: int, hparams: dict | None = None,
                 same_draws: bool = False) -> tuple[SimState, RoundStats]:
    """num_rounds rounds in one compiled chunk; `state` (donated) and the result
    hold the per-client state in client order. `hparams`: see hparams_for
    (default: the config's). The state's run key must be the release's of these
    settings (init_state, init_state(hparams) for hparams_for's, or a state they
    led to): another release's would share its cohorts and noise, and two models
    released so subtract to their clipped sums. `same_draws=True` lifts that for a
    measurement whose outputs are not released (the differential method: the same
    round with and without noise, on the same draws)."""
    if not same_draws:
      self._check_release_key(state, hparams)
    state, stats = self.run_working(self.to_working(state), num_rounds, hparams)
    return self.to_client_order(state), stats

  def _check_release_key(self, state: SimState, hparams: dict | None) -> None:
    """ConfigError where `state` holds another release's run key (noise_seed 'secret':
    the key is the operating system's, nothing to compare)."""
    cfg = self.cfg if hparams is None else self._release_of(hparams)
    if cfg is None or self.setup.noise_seed == "secret":
      return   # unissued hyperparameters: run_working refuses them
    want = np.asarray(release_identity.run_key(cfg, self.inputs_digest))
    if not np.array_equal(np.asarray(state.key), want):
      raise ConfigError("run_rounds: the state's run key is another release's, so the two "
                        "would share their cohorts and noise (two models released so "
                        "subtract to their clipped sums): start from this simulation's "
                        "init_state() (init_state(hparams) for hparams_for's), or pass "
                        "same_draws=True for a measurement that is not released")

  def _check_strategy_rounds(self, state: SimState, num_rounds: int) -> None:
    """A correlated-noise strategy is built for `rounds` rounds (its matrix, its
    sensitivity, its charges): running past them would release rounds no charge
    covers (ConfigError, nothing run)."""
    strategy = self.privacy.strategy
    if strategy is None:
      return
    end = int(np.max(np.asarray(state.round))) + num_rounds   # replicas: the furthest
    if end > len(strategy.charges):
      raise ConfigError(f"run_rounds: {num_rounds} rounds from round {end - num_rounds} pass "
                        f"the {len(strategy.charges)} rounds dp {self.cfg.dp!r}'s strategy "
                        "was built for (its matrix, sensitivity and charges): build a "
                        "simulation with more rounds")

  def run_working(self, state: SimState, num_rounds: int,
                  hparams: dict | None = None) -> tuple[SimState, RoundStats]:
    """run_rounds on a state in the working layout (`to_working`), returned in it.
    A loop over many chunks converts once at each end (and where it reads the
    per-client state: `to_client_order` copies): with resident state, each
    conversion moves the whole per-client table between devices."""
    if hparams is not None and self._release_of(hparams) is None:
      raise ConfigError("run_rounds: these hyperparameters were not made by this "
                        "simulation's hparams_for or with_hparams (an edited pytree can "
                        "change the noise applied without the RDP charged)")
    self._check_strategy_rounds(state, num_rounds)
    hp = self.hparams if hparams is None else self.replicate(
        jax.tree.map(jnp.asarray, hparams))
    if self.paging is not None:   # the per-client state in a host table, round by round
      return paged_state.run_pages(self.paging, lambda s, n: self.run_chunk(s, self.store, hp, n),
                                   state, num_rounds, self.store.client_count)
    return self.run_chunk(state, self.store, hp, num_rounds)
