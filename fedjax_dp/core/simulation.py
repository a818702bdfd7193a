"""One round is one compiled program; rounds between evaluations are one `lax.scan`.

A round, all inside jit:
  1. cohort sampling (fixed-size or Poisson) from the round's key;
  2. local training of every cohort client, the cohort axis sharded over the
     `clients` mesh axis with `shard_map`; on each device the local clients
     run either as a `vmap` (GPU) or as a sequential `lax.map` of plain
     matmuls (CPU, where XLA's batched matmul is slow: see BENCHMARKS.md);
  3. aggregation: example-weighted mean of the deltas, one contraction per
     device and one `psum` across devices;
  4. the server optimizer (optax) applied to the pseudo-gradient -mean_delta.
The same code runs on one device (a mesh of one) and on many.

Keys: round r uses fold_in(run_key, r); within it, purpose tags separate the
cohort draw from client training, and client c trains with
fold_in(fold_in(round_key, CLIENT_TRAINING), c). No key is used twice.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp.privacy import accounting
from fedjax_dp.robust import attacks
from fedjax_dp.training import client as client_lib
from fedjax_dp.privacy import dp_round
from fedjax_dp.core import hparams as hparams_lib
from fedjax_dp import losses
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy import noise_control
from fedjax_dp import objectives
from fedjax_dp.compression import pipeline as pipeline_lib
from fedjax_dp import robust
from fedjax_dp.training import server as server_lib
from fedjax_dp.training import server_stages as server_stages_lib
from fedjax_dp.config import Config, ConfigError
from fedjax_dp.kernels import robust_aggregation, weighted_mean
from fedjax_dp.models import Model
from fedjax_dp.placement.store import FederatedStore, default_max_cohort, sample_cohort, target_dtype

# fold_in tags: one per random purpose inside a round
COHORT_SAMPLING = 0
CLIENT_TRAINING = 1
SERVER_NOISE = 2
LOCAL_NOISE = 3
CLIP_COUNT_NOISE = 4
PIPELINE = 5
SHUFFLE = 6  # reserved: the simulated mean needs no permutation (_client_phase)
KEPT_NOISE = 7
DOWNLINK = 8
BYZANTINE = 9
MODEL_INIT = 2**20  # folded into the run key itself, never into a round key
SCORE_GRID = dp_round.SCORE_GRID


class SimState(NamedTuple):
  """Everything a run needs to continue bit for bit; saved whole by checkpoints."""
  round: jax.Array            # int32 scalar: rounds completed
  params: Any                 # server model
  server_opt_state: Any       # optax state of the server optimizer
  client_state: Any           # per-client pytrees, leading axis [num_clients] (empty for FedAvg)
  server_state: Any           # the algorithm's server-side state (e.g. SCAFFOLD's control variate)
  key: jax.Array              # uint32[2] run key
  participations: jax.Array   # int32: client participations so far (for bytes)
  cohort_overflow: jax.Array  # int32: Poisson draws dropped for lack of cohort room
  ledger: jax.Array           # float32 RDP spent: [orders] (central, zeros without DP),
                              # [num_clients, orders] (local: one ledger per client)
  clip_norm: jax.Array        # float32: the clip norm of the next round (moves if adaptive)


class RoundStats(NamedTuple):
  loss_sum: jax.Array      # sum of local minibatch losses weighted by batch examples
  examples: jax.Array      # example-visits in local training this round
  participants: jax.Array  # int32 clients that trained this round
  unclipped: jax.Array     # int32 participants whose update norm was <= the clip norm
  spent: jax.Array         # int32 cohort draws refused because the client's budget is spent
  flagged: jax.Array       # int32 uploads the aggregator flagged as outliers or left out
  clusters: jax.Array      # int32 clusters the `cluster` aggregator formed (0 otherwise)
  event: jax.Array         # int32 what the round released, for the host's privacy log:
                           # the index into Privacy.event_multipliers of the noise the
                           # accountant charged (central DP; local DP: 0 when anyone took
                           # part, static noise), -1 when nothing was released, -2 for
                           # local DP's scheduled noise (composed in the clients' ledgers)
  lr: jax.Array            # float32 the clients' learning rate this round
  nonfinite: jax.Array     # int32 uploads with a NaN or inf, replaced by zero before the
                           # mechanism (DP or kept noise; unnoised diagnostic)


@dataclasses.dataclass(frozen=True)
class Privacy:
  """The static DP set-up of a compiled round (resolved from the config)."""
  mode: str = "none"               # none | central | local
  layout: Any = None               # mechanisms.ClipLayout
  update_noise_multiplier: float = 0.0  # std of the noise on updates / clip norm
  noise_multiplier: float = 0.0    # what the accountant charges (z)
  accounted_noise_multiplier: float = 0.0  # the parts' noise composed into one Gaussian
                                           # (tiers: below z; 0 without noise)
  event_rdp: Any = None            # np [orders]: RDP of one round (central) or one participation (local)
  target_epsilon: float | None = None
  delta: float = 1e-5
  adaptive: bool = False
  count_stddev: float = 0.0
  schedule: str = "static"         # noise_control.SCHEDULES (local DP)
  client_budgets: Any = None       # np [num_clients] per-client target epsilons (None: target_epsilon)
  event_table: Any = None          # np [SCORE_GRID, orders]: central DP's round RDP at controller
                                   # outputs k / (SCORE_GRID - 1) (adaptive noise)
  stop_in_round: bool = False      # central DP: a round that would pass target_epsilon is skipped
  event_multipliers: tuple = ()    # float64: the accounted multiplier of each event a round can
                                   # release (RoundStats.event indexes it): one with static
                                   # noise, central DP's SCORE_GRID tabulated ones with a schedule

  def tier_scales(self) -> tuple[float, ...]:
    """The static per-part noise multipliers (all 1 without tiers)."""
    return self.layout.noise_scales or (1.0,) * len(self.layout.fractions)


def make_mesh(num_devices: int = 0) -> Mesh:
  """A 1-D mesh named `clients` over the first `num_devices` devices (0 = all)."""
  devices = jax.devices()
  if num_devices:
    if num_devices > len(devices):
      raise ConfigError(f"config key 'devices' = {num_devices}: this machine has "
                        f"{len(devices)}; allowed are 0 (all) to {len(devices)}")
    devices = devices[:num_devices]
  return Mesh(np.array(devices), ("clients",))


def learning_rate_schedule(cfg: Config) -> Callable[[jax.Array], jax.Array]:
  """Client learning rate as a function of the round (constant or cosine to lr_min)."""
  if cfg.lr_schedule == "constant":
    return lambda r: jnp.float32(cfg.lr)
  return optax.cosine_decay_schedule(cfg.lr, decay_steps=cfg.rounds, alpha=cfg.lr_min / cfg.lr)


def round_learning_rate(hp: dict, round_index: jax.Array, schedule: str, rounds: int):
  """learning_rate_schedule's value from the hyperparameters as data (hparams.py):
  optax's cosine decay, lr (span c + alpha), with the same roundings."""
  if schedule == "constant":
    return hp["lr"]
  count = jnp.minimum(round_index, float(rounds))
  cosine = 0.5 * (1 + jnp.cos(jnp.pi * count / float(rounds)))
  return hp["lr"] * (hp["lr_span"] * cosine ** 1.0 + hp["lr_alpha"])


@dataclasses.dataclass(frozen=True)
class Simulation:
  """A compiled federated simulation: build with `build_simulation`."""
  cfg: Config
  model: Model
  store: FederatedStore
  mesh: Mesh
  cohort_capacity: int        # cohort slots per round, padded to a multiple of the mesh size
  client_parallelism: str     # 'map' or 'vmap', resolved from 'auto'
  run_chunk: Callable         # (working state, store, hparams, length) -> (state, RoundStats [length])
  evaluate: Callable          # (params, x, y, mask) -> {metric name: mean over the test set}
  privacy: Privacy = Privacy()
  hparams: Any = None         # the round's numeric hyperparameters (hparams.py), replicated
  analysis: Any = None        # the sensitivity analyzer's report (tier_source 'analyzer')
  # client order <-> the layout the compiled rounds keep the per-client state in
  # (identity but with resident state; see build_simulation)
  to_working: Callable = lambda state: state
  to_client_order: Callable = lambda state: state
  feature_tiers: Any = None   # as given to build_simulation (hparams_for rebuilds privacy)
  calibrated: float | None = None   # as given to build_simulation
  # digests of the hyperparameter pytrees this simulation made (run_rounds refuses others:
  # an edited pytree could change the noise applied but not the RDP charged)
  issued: set = dataclasses.field(default_factory=set)
  _privacy_cache: dict = dataclasses.field(default_factory=dict)   # (cfg, calibrated) -> Privacy
  # the test set in evaluation batches (batch_for_eval), set by runner.setup:
  # sim.evaluate(state.params, *sim.test_data)
  test_data: Any = None

  @property
  def noise_multiplier(self) -> float:
    """The noise multiplier the accountant charges (configured or calibrated)."""
    return self.privacy.noise_multiplier

  def replicate(self, tree):
    """Places a pytree replicated on the mesh, as the compiled round returns it
    (so the first and later calls share one compilation)."""
    return jax.device_put(tree, NamedSharding(self.mesh, P()))

  def init_state(self, hparams: dict | None = None) -> SimState:
    """Round 0's state. With noise_seed 'secret' the run key (cohorts, training,
    noise) comes from the operating system's entropy: neither the seed nor
    config.json then tells the noise; the model's initialisation stays seeded.
    `hparams` (hparams_for): the clip norm the run starts from."""
    state = init_state(self.cfg, self.model)
    if self.cfg.noise_seed == "secret":
      state = state._replace(key=secret_run_key())
    if hparams is not None:
      state = state._replace(clip_norm=jnp.asarray(hparams["clip_norm"], jnp.float32))
    return self.replicate(state)

  def with_hparams(self, **overrides) -> "Simulation":
    """This simulation with config keys that are data changed (hparams.NUMERIC_KEYS):
    the same compiled round (no recompilation), the new config, privacy set-up and
    hyperparameters, so that its init_state, epsilons, privacy log and report
    (privacy_report.privacy_report(sim.cfg, sim, state, log)) all follow the new
    values. Derived entries (the RDP a round is charged, budget limits) are
    recomputed with the config path's own functions: the ledger charges what the
    round applies. Structural changes, and keys that would change nothing in this
    round, are refused in one line."""
    cfg, privacy, hp = self._issue(overrides)
    return dataclasses.replace(self, cfg=cfg, privacy=privacy, hparams=self.replicate(
        jax.tree.map(jnp.asarray, hp)))

  def hparams_for(self, **overrides) -> dict:
    """`with_hparams(**overrides).hparams` as host arrays, for stacking replicas
    (`jax.vmap` over run_chunk) or run_rounds(hparams=...). A run's reports and
    privacy log must come from the matching `with_hparams` simulation."""
    return self._issue(overrides)[2]

  def _issue(self, overrides: dict):
    """(config, privacy, host hyperparameters) with `overrides`; the pytree's digest
    is recorded, so that run_rounds accepts it."""
    cfg, privacy = self._config_and_privacy(overrides)
    hp = hparams_lib.round_hparams(cfg, privacy)
    self.issued.add(hparams_lib.digest(hp))
    return cfg, privacy, hp

  def privacy_for(self, **overrides) -> Privacy:
    """make_privacy of the config with `overrides` (see with_hparams)."""
    return self._config_and_privacy(overrides)[1]

  def _config_and_privacy(self, overrides: dict):
    from fedjax_dp.config import make_config
    bad = sorted(set(overrides) - set(hparams_lib.NUMERIC_KEYS))
    if bad:
      raise ConfigError(f"with_hparams: {', '.join(bad)} shape the compiled round (a new "
                        "simulation is needed); the keys that are data are "
                        f"{', '.join(hparams_lib.NUMERIC_KEYS)}")
    cfg = make_config(overrides, base=self.cfg)
    hparams_lib.check_same_structure(self.cfg, cfg)
    hparams_lib.check_overridable(self.cfg, overrides, self.calibrated,
                                  self.privacy.client_budgets is not None)
    privacy = self._privacy_of(cfg, overrides)
    structure = lambda p: (p.layout and p.layout._replace(noise_scales=p.layout.noise_scales
                                                          is None),
                           p.stop_in_round, len(p.event_multipliers))
    if structure(privacy) != structure(self.privacy):
      raise ConfigError(f"with_hparams: {overrides} change the privacy set-up's structure; "
                        "build a new simulation")
    for key in overrides:   # a key this round never reads would give N identical replicas
      if getattr(cfg, key) != getattr(self.cfg, key) and hparams_lib.same(
          self.hparams, hparams_lib.round_hparams(*self._one_change(key, overrides[key]))):
        raise ConfigError(f"with_hparams: {key} = {overrides[key]!r} changes nothing in this "
                          "simulation's round (its stage or schedule is not on)")
    return cfg, privacy

  def _one_change(self, key, value):
    from fedjax_dp.config import make_config
    cfg = make_config({key: value}, base=self.cfg)
    return cfg, self._privacy_of(cfg, {key: value})

  def _privacy_of(self, cfg: Config, overrides: dict) -> Privacy:
    """make_privacy of a changed config (cached: a calibration with a noise schedule
    tabulates 17 RDP curves), keeping this simulation's calibration unless the
    overrides recalibrate, and its per-client budgets."""
    calibrated = None if hparams_lib.RECALIBRATING & set(overrides) else self.calibrated
    if (cfg, calibrated) not in self._privacy_cache:
      privacy = make_privacy(cfg, self.model, self.feature_tiers, calibrated)
      if self.privacy.client_budgets is not None:
        privacy = dataclasses.replace(privacy, client_budgets=self.privacy.client_budgets)
      self._privacy_cache[(cfg, calibrated)] = privacy
    return self._privacy_cache[(cfg, calibrated)]

  def epsilons(self, state: SimState):
    """(epsilon, optimal order) spent, by the in-round RDP ledger, as float64 numpy:
    scalars for central DP, [num_clients] arrays for local DP."""
    return accounting.epsilons_np(np.asarray(state.ledger, np.float64), self.cfg.delta)

  def next_event_rdp(self, state: SimState) -> np.ndarray:
    """float64 [orders] (or [num_clients, orders] with per-cluster noise): the RDP
    one participation in the next round costs (local DP)."""
    p = self.privacy
    if p.schedule == "static":
      event = np.asarray(p.event_rdp, np.float64)
    else:
      score = float(state.server_state["noise_control"]["score"])
      scales = np.asarray(noise_control.noise_scales(p.schedule, score, p.tier_scales(),
                                                     self.cfg.convergence_beta), np.float64)
      event = noise_control.local_event_rdp_np(p.update_noise_multiplier, p.layout.fractions,
                                               scales)
    if self.cfg.cluster_noise == "equalize":
      cn = state.server_state["cluster_noise"]
      f = np.asarray(noise_control.cluster_noise_factors(cn["size"], cn["median"]), np.float64)
      event = event[None, :] / f[:, None] ** 2
    return event

  def client_budgets(self) -> np.ndarray | None:
    """float64 [num_clients]: each client's target epsilon (None without a target)."""
    if self.privacy.client_budgets is not None:
      return self.privacy.client_budgets
    if self.cfg.target_epsilon is None:
      return None
    return np.full(self.cfg.num_clients, self.cfg.target_epsilon)

  def run_rounds(self, state: SimState, num_rounds: int,
                 hparams: dict | None = None) -> tuple[SimState, RoundStats]:
    """num_rounds rounds in one compiled chunk; `state` (donated) and the result
    hold the per-client state in client order. `hparams`: see hparams_for
    (default: the config's)."""
    state, stats = self.run_working(self.to_working(state), num_rounds, hparams)
    return self.to_client_order(state), stats

  def run_working(self, state: SimState, num_rounds: int,
                  hparams: dict | None = None) -> tuple[SimState, RoundStats]:
    """run_rounds on a state in the working layout (`to_working`), returned in it.
    A loop over many chunks converts once at each end (and where it reads the
    per-client state: `to_client_order` copies): with resident state, each
    conversion moves the whole per-client table between devices."""
    if hparams is not None and hparams_lib.digest(hparams) not in self.issued:
      raise ConfigError("run_rounds: these hyperparameters were not made by this "
                        "simulation's hparams_for or with_hparams (an edited pytree can "
                        "change the noise applied without the RDP charged)")
    hp = self.hparams if hparams is None else self.replicate(
        jax.tree.map(jnp.asarray, hparams))
    return self.run_chunk(state, self.store, hp, num_rounds)


def secret_run_key() -> jax.Array:
  """A uint32[2] PRNG key from the operating system's entropy (os.urandom)."""
  return jnp.asarray(np.frombuffer(os.urandom(8), np.uint32))


def init_state(cfg: Config, model: Model) -> SimState:
  key = jax.random.PRNGKey(cfg.seed)
  params = model.init(jax.random.fold_in(key, MODEL_INIT))
  server_opt = server_lib.make_server_optimizer(cfg)
  ledger_shape = (cfg.num_clients,) if cfg.dp == "local" else ()
  objective = objectives.make_objective(cfg)
  one_client = objective.init_client_state(params)
  server_state = objective.init_server_state(params)
  d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  client_pipeline = pipeline_lib.make_client_pipeline(cfg, d)
  if client_pipeline is not None:
    one_client["pipeline"] = client_pipeline.init(d)
  aggregator = robust.get_aggregator(cfg.aggregator)
  if aggregator.stateful:   # only then: a stateless rule's runs keep their state pytree
    server_state["aggregator"] = aggregator.init(d, cfg.num_clients)
  server_state.update(server_stages_lib.make_server_stages(cfg, cfg.dp != "none", DOWNLINK)
                      .init(params, d))
  client_state = jax.tree.map(lambda a: jnp.broadcast_to(a, (cfg.num_clients,) + a.shape),
                              one_client)
  return SimState(round=jnp.int32(0), params=params, server_opt_state=server_opt.init(params),
                  client_state=client_state, server_state=server_state,
                  key=key, participations=jnp.int32(0),
                  cohort_overflow=jnp.int32(0),
                  ledger=accounting.init_ledger(shape=ledger_shape),
                  clip_norm=jnp.float32(cfg.clip_norm))


def _client_phase(params, cohort_ids, cohort_mask, client_hp, round_key, clip_norm, noise_scales,
                  client_noise_factor, client_state, server_state, x, y, client_index,
                  client_count, *, train_one: Callable,
                  objective: objectives.Objective, model: Model, parallelism: str,
                  client_batch: int, privacy: Privacy, client_pipeline, shuffle: bool,
                  aggregate_noise: bool, robust_aggregator: Callable | None,
                  malicious: np.ndarray | None, attack: tuple[str, float],
                  cluster_threshold: float | None = None, resident: bool = False,
                  keep_rows: bool = True, guard_nonfinite: bool = False,
                  dp_client: Callable | None = None):
  """Runs on each device over its slice of the cohort; returns psum'd totals.

  cohort_ids, cohort_mask: [local_cohort]; client_state: every client's state,
  leaves [num_clients, ...], replicated: each client reads its own row where it
  trains (a gather of the cohort's rows beforehand would copy them all once
  more) and its new row is written back batch by batch (map_clients_with_state).
  With `resident`, client_state is instead this device's rows in the resident
  layout, [local_cohort, ...], row i that of slot i
  (map_clients_with_resident_state), and comes back the same way.
  guard_nonfinite: an upload's NaN or inf coordinates enter the client pipeline
  (its clips, noise and residual) as zero; under DP, clip_update sends an update
  whose norm is not finite as zero. Both are counted.
  keep_rows: a slot that does not take part returns its state row unchanged.
  False where no real client's row can be one: the replicated table drops
  those slots' writes, and a resident table's only such slots are padding
  (static) unless clients can be refused (budgets, a skipped round).
  client_hp: this round's client hyperparameters (hparams.py): lr, update_noise
  (local DP), momentum (where the client optimizer has momentum).
  Returns (aggregate, stats, client state, the psum of the objective's server
  contributions, cluster info, server-state slots), all but a resident client
  state identical on all devices.
  noise_scales [parts]: this round's local noise std per part, over
  noise_multiplier * clip_norm; client_noise_factor [num_clients]: each
  client's own multiplier on top (per-cluster noise, else ones). With
  `cluster_threshold` (per-cluster noise) a fifth output holds the cohort's
  clusters (ids, mask and cluster size per upload, the median cluster size),
  else (). The server-state slots are {"aggregator": its new state} for a
  stateful robust_aggregator (which reads server_state["aggregator"]), else {}.
    dp none: the example-weighted mean delta (FedAvg).
    dp central: the plain sum of the deltas, each clipped to `clip_norm` (the
      server noises the sum; weights by example count would give one client
      unbounded influence).
    dp local: the mean over participants of the deltas, each clipped and
      noised by its client with N(0, (z clip_norm)^2) from the client's own key.
    aggregator other than mean: the rule applied to the cohort's uploads,
      all-gathered over the device axis (see fedjax_dp/robust/).
  """
  # Replicated params enter as device-invariant values; per-client gradients
  # must see them as varying, or grad sums them over devices (JAX_NOTES.md).
  params = jax.lax.pcast(params, "clients", to="varying")
  counts = jnp.where(cohort_mask, client_count[cohort_ids], 0)
  client_key = jax.random.fold_in(round_key, CLIENT_TRAINING)
  keys = jax.vmap(lambda c: jax.random.fold_in(client_key, c))(cohort_ids)
  # The plain (example- or uniformly-) weighted mean of the uploads is summed
  # inside the client loop: stacking [local, d] uploads cost a zeroed buffer,
  # a write and a read of it per round. DP, attacks and robust rules need the
  # uploads one by one and stack them.
  sum_in_loop = privacy.mode == "none" and malicious is None and robust_aggregator is None
  one = _client_step(params, client_hp, server_state, x, y,
                     jax.random.fold_in(round_key, PIPELINE), train_one=train_one,
                     objective=objective, model=model, client_pipeline=client_pipeline,
                     guard_nonfinite=guard_nonfinite, keep_rows=keep_rows,
                     aggregate_noise=aggregate_noise, summed=sum_in_loop, shuffle=shuffle)
  args = (client_index[cohort_ids], counts, keys, cohort_mask, cohort_ids)
  batch = cohort_ids.shape[0] if parallelism == "vmap" else client_batch
  sums = None
  if sum_in_loop:
    sums = {"delta": jax.tree.map(jnp.zeros_like, params)}
    if aggregate_noise:
      sums["noise_var"] = jnp.zeros_like(ravel_pytree(params)[0])   # [d], varying like params
  if resident:
    out, client_state = map_clients_with_resident_state(one, args, client_state, batch, sums)
  else:
    # refused and padded slots write nothing back (a padded slot may repeat a real id)
    write_ids = jnp.where(cohort_mask, cohort_ids, client_count.shape[0])
    out, client_state = map_clients_with_state(one, args, client_state, cohort_ids, write_ids,
                                               batch, sums)
  (res, contribs, owed, nonfinite), sums = out if sum_in_loop else (out, None)
  contrib_sum = jax.lax.psum(jax.tree.map(lambda c: jnp.sum(c, axis=0), contribs), "clients")
  mask_f = cohort_mask.astype(jnp.float32)
  weights, deltas = counts.astype(jnp.float32), res.delta  # FedAvg: n_i / n (or () summed)
  unclipped = jnp.zeros((), jnp.int32)
  if privacy.mode != "none":
    weights = mask_f
    deltas, unclipped, clip_nonfinite = dp_client(deltas, cohort_ids, cohort_mask, round_key,
                                                  clip_norm, client_hp, noise_scales,
                                                  client_noise_factor)
    nonfinite = nonfinite | clip_nonfinite
  if malicious is not None:
    deltas = attacks.replace_uploads(deltas, jnp.asarray(malicious)[cohort_ids] & cohort_mask,
                                     cohort_ids, jax.random.fold_in(round_key, BYZANTINE),
                                     *attack)
  if shuffle:
    # The shuffler hands the server, per layer, the cohort's tuples in random
    # order: the server cannot link sizes to updates, so it weights uniformly.
    # The server's plain sum of each layer's multiset is the same for every
    # permutation, and the robust rules refuse shuffled tuples (config.py), so
    # the rows are not permuted here (pipeline.layerwise_shuffle): on CPU the
    # permutation cost 7 % of a TopkSDP-FL round and changed no number beyond
    # float summation order.
    weights = mask_f
  flagged = clusters = jnp.zeros((), jnp.int32)
  cluster_info, server_slots = (), {}
  if robust_aggregator is not None:
    mean_delta, flagged, clusters, cluster_info, server_slots = _robust_aggregate(
        deltas, cohort_ids, cohort_mask, weights * mask_f, server_state, client_hp["aggregator"],
        robust_aggregator, cluster_threshold)
  else:
    mean_delta = _linear_aggregate(deltas, weights, mask_f, counts, sums, owed, round_key,
                                   mode=privacy.mode, shuffle=shuffle,
                                   aggregate_noise=aggregate_noise)
  # the integer counts in one all-reduce: a separate psum for the non-finite count
  # alone cost TopkSDP-FL's round 4-5 % on 2 CPU devices (BENCHMARKS.md, issue 18)
  participants, unclipped, nonfinite = jax.lax.psum(jnp.stack([
      jnp.sum(cohort_mask, dtype=jnp.int32), unclipped,
      jnp.sum(nonfinite, dtype=jnp.int32)]), "clients")
  stats = RoundStats(loss_sum=jax.lax.psum(jnp.sum(res.loss_sum * mask_f), "clients"),
                     examples=jax.lax.psum(jnp.sum(res.examples * mask_f), "clients"),
                     participants=participants, unclipped=unclipped,
                     spent=jnp.zeros((), jnp.int32), flagged=flagged, clusters=clusters,
                     event=jnp.zeros((), jnp.int32), lr=client_hp["lr"],
                     nonfinite=nonfinite)
  return mean_delta, stats, client_state, contrib_sum, cluster_info, server_slots


def _client_step(params, client_hp, server_state, x, y, pipeline_key, *, train_one, objective,
                 model, client_pipeline, guard_nonfinite: bool, keep_rows: bool,
                 aggregate_noise: bool, summed: bool, shuffle: bool) -> Callable:
  """One client's work, (args, state row) -> (outputs, new row): local training on
  the objective with its local terms, the terms' after-training step, then the
  client pipeline (clips, top-k, kept noise). `summed`: the upload is returned
  weighted for the in-loop sum (FedAvg: n_i; shuffled tuples: uniform) instead
  of stacked."""
  lr = client_hp["lr"]

  def one(args, cstate):
    row, count, key, took_part, cid = args
    start = cstate["model"] if objective.solo else params
    ctx = objectives.LocalContext(start, cstate, server_state)
    loss_fn = objective.make_loss(model.apply, model.apply_with_features, ctx,
                                  hp=client_hp["terms"])
    res = train_one(start, row, count, key, lr, x=x, y=y, loss_fn=loss_fn,
                    momentum=client_hp.get("momentum"))
    upload, cstate, contrib = objective.finish(ctx, res.delta, res.params, res.steps, lr,
                                               took_part, keep_rows, hp=client_hp["terms"])
    bad = jnp.zeros((), bool)
    owed = ()
    if client_pipeline is not None:
      if guard_nonfinite:
        # a NaN or inf would reach the noise, the residual and the released sum: such
        # coordinates enter the pipeline as zero, whose clips then bound the upload as
        # any other (the select fuses into the ravel; the count is one read of it)
        bad = ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(upload)]))
        upload = jax.tree.map(lambda a: jnp.where(jnp.isfinite(a), a, 0.0), upload)
        bad = bad & took_part
      flat, unravel = ravel_pytree(upload)
      stage_ctx = pipeline_lib.StageContext(
          key=jax.random.fold_in(pipeline_key, cid), num_examples=count, lr=lr,
          public_update=server_state.get("public_update", jnp.zeros_like(flat)))
      sent, pstate = client_pipeline.update(
          pipeline_lib.Upload(flat, jnp.ones(flat.shape, bool)), cstate["pipeline"], stage_ctx)
      cstate["pipeline"] = (jax.tree.map(lambda a, b: jnp.where(took_part, a, b), pstate,
                                         cstate["pipeline"]) if keep_rows else pstate)
      upload = unravel(sent.values)
      if aggregate_noise:  # the noise this upload owes, drawn below for the sum
        owed = (sent.sent, jnp.asarray(sent.noise_std, jnp.float32))
    if not summed:
      return (res._replace(delta=upload, params=()), contrib, owed, bad), cstate
    w = (took_part if shuffle else count).astype(jnp.float32)
    out = {"delta": jax.tree.map(lambda a: w * a, upload)}
    if owed:  # the owed noise's variance on the weighted sum (aggregate_noise_var)
      out["noise_var"] = jnp.square(w * owed[1]) * owed[0].astype(jnp.float32)
    return ((res._replace(delta=(), params=()), contrib, (), bad), out), cstate
  return one


def _robust_aggregate(deltas, cohort_ids, cohort_mask, weights, server_state, hp, rule,
                      cluster_threshold):
  """A robust rule over every upload: the cohort all-gathered over the devices,
  aggregated replicated. Returns (aggregate, flagged, clusters, cluster info,
  server-state slots: the rule's new state where it keeps one)."""
  rows = jax.vmap(lambda t: ravel_pytree(t)[0])(deltas)
  all_rows, all_mask = gather_over_devices(rows), gather_over_devices(cohort_mask)
  all_weights = gather_over_devices(weights)
  unravel = ravel_pytree(jax.tree.map(lambda d: d[0], deltas))[1]
  if cluster_threshold is None:
    # (u, mask, weights, state, hp) -> (aggregate, state, metrics); the rule's state,
    # replicated, lives in server_state["aggregator"] when it keeps one
    agg, agg_state, metrics = rule(all_rows, all_mask, all_weights,
                                   server_state.get("aggregator", ()), hp)
    slots = {"aggregator": agg_state} if "aggregator" in server_state else {}
    return unravel(agg), metrics["flagged"], metrics["clusters"], (), slots
  # the cluster rule whose clusters also set next round's noise: cluster once
  # (on the finite uploads, as the registry's rules)
  all_rows, all_mask, flagged = robust_aggregation.finite_participants(all_rows, all_mask)
  labels = robust_aggregation.cosine_clusters(all_rows, all_mask, cluster_threshold)
  agg, clusters = robust_aggregation.clustered_mean(all_rows, all_mask, all_weights,
                                                    cluster_threshold, labels)
  same = (labels[:, None] == labels[None, :]) & all_mask[None, :]
  size = jnp.sum(same, axis=1).astype(jnp.float32)                     # [M]
  heads = all_mask & (labels == jnp.arange(labels.shape[0]))            # one per cluster
  median = robust_aggregation.coordinate_median(size[:, None], heads)[0]
  cluster_info = (gather_over_devices(cohort_ids), all_mask, size, median)
  return unravel(agg), flagged, clusters, cluster_info, {}


def _linear_aggregate(deltas, weights, mask_f, counts, sums, owed, round_key, *, mode: str,
                      shuffle: bool, aggregate_noise: bool):
  """The weighted sum of the uploads over the devices (summed in the client loop
  where `sums`), plus the kept-coordinate noise owed to it in one draw; divided by
  the total weight (FedAvg: n, shuffled or local DP: participants), or the plain
  sum under central DP (the server noises the sum and divides)."""
  if sums is not None:   # weight_of(...) is weights * mask_f, summed in the loop
    delta_sum = jax.lax.psum(sums["delta"], "clients")
  else:
    delta_sum = jax.lax.psum(weighted_mean.weighted_sum(weights, deltas), "clients")
  if aggregate_noise:
    # sum_i w_i n_i for the owed kept-coordinate noise, in one draw of the same
    # distribution (pipeline.gaussian_on_kept). The weights pair with their own
    # client's mask and std: shuffling is per layer but its weights are uniform.
    if sums is not None:
      var = sums["noise_var"]
    else:
      sent, noise_std = owed
      var = pipeline_lib.aggregate_noise_var(weights * mask_f, noise_std, sent)
    std = jnp.sqrt(jax.lax.psum(var, "clients"))
    flat, unravel = ravel_pytree(delta_sum)
    noise = std * jax.random.normal(jax.random.fold_in(round_key, KEPT_NOISE), flat.shape)
    delta_sum = unravel(flat + noise)
  if mode == "central":
    return delta_sum
  total_weight = jax.lax.psum(jnp.sum(counts if (mode == "none" and not shuffle) else mask_f,
                                      dtype=jnp.float32), "clients")
  return jax.tree.map(lambda d: d / jnp.maximum(total_weight, 1.0), delta_sum)


def gather_over_devices(a: jax.Array) -> jax.Array:
  """Inside shard_map: every device's slice of `a`, concatenated along axis 0."""
  return jax.lax.all_gather(a, "clients", tiled=True, to="invarying")


def _vmap_clients(fn: Callable) -> Callable:
  """jax.vmap(fn) over a group of clients, except that a group of one calls fn on
  the client itself: vmapped, a training loop whose trip count is per client
  becomes a while loop that selects its whole carry at every step, traffic a
  single client does not need."""
  def call(*args):
    if jax.tree.leaves(args)[0].shape[0] == 1:
      out = fn(*jax.tree.map(lambda a: a[0], args))
      return jax.tree.map(lambda a: a[None], out)
    return jax.vmap(fn)(*args)
  return call


def _map_in_batches(step: Callable, carry, slots, batch: int):
  """lax.scan of step(carry, chunk) over `slots` (leaves [local, ...]) in chunks of
  `batch`, the remainder as one smaller chunk; outputs stacked [local, ...]."""
  local = jax.tree.leaves(slots)[0].shape[0]
  batch = max(1, min(batch, local))
  full = local // batch * batch
  head = jax.tree.map(lambda a: a[:full].reshape((full // batch, batch) + a.shape[1:]), slots)
  carry, out = jax.lax.scan(step, carry, head)
  out = jax.tree.map(lambda a: a.reshape((full,) + a.shape[2:]), out)
  if full < local:
    carry, tail = step(carry, jax.tree.map(lambda a: a[full:], slots))
    out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, tail)
  return out, carry


def _map_with_table(step: Callable, table, slots, batch: int, sums):
  """_map_in_batches of step(table, chunk) -> (table, out) -> (out, table). With
  `sums` (a pytree of zeros), out is (stacked, summed) per group; the summed
  parts are added up in the loop's carry instead of being stacked, and the
  result is ((stacked outputs, sums), table)."""
  def summing_step(carry, chunk):
    table, acc = carry
    table, out = step(table, chunk)
    if sums is not None:
      out, part = out
      acc = jax.tree.map(lambda a, p: a + jnp.sum(p, axis=0), acc, part)
    return (table, acc), out

  out, (table, acc) = _map_in_batches(summing_step, (table, () if sums is None else sums),
                                      slots, batch)
  return ((out, acc) if sums is not None else out), table


def map_clients_with_state(fn: Callable, args, client_state, read_ids: jax.Array,
                           write_ids: jax.Array, batch: int, sums=None):
  """lax.map(fn, args, batch_size=batch) for clients that read and write their row
  of the replicated per-client state; runs inside shard_map over "clients".

  fn(args_i, state_row_i) -> (outputs_i, new_state_row_i); args [local, ...];
  client_state leaves [num_clients, ...], the same on every device; read_ids
  [local]: the row each slot reads; write_ids [local]: the row it writes
  (num_clients: none). Returns (outputs stacked
  [local, ...], client_state with every device's new rows written, identical on
  all devices). The new rows are all-gathered over the devices after each batch:
  on CPU that moved 100 clients' 199,210-float rows 4x faster than one all-gather
  of the whole cohort after the loop, and the copy overlaps the training.
  With `sums` (a pytree of zeros), fn returns ((outputs_i, summed_i), row) and
  the first result is (outputs stacked, the sum of the summed_i over this
  device's slots): summed in the loop, a large per-client output (an upload)
  is never stacked."""
  def step(table, chunk):
    chunk_args, reads, writes = chunk
    rows = jax.tree.map(lambda a: a[reads], table)
    out, new_rows = _vmap_clients(fn)(chunk_args, rows)
    if jax.tree.leaves(table):
      where = gather_over_devices(writes)
      table = jax.tree.map(lambda a, r: a.at[where].set(gather_over_devices(r), mode="drop"),
                           table, new_rows)
    return table, out

  return _map_with_table(step, client_state, (args, read_ids, write_ids), batch, sums)


def map_clients_with_resident_state(fn: Callable, args, local_state, batch: int, sums=None):
  """lax.map(fn, (args, local_state), batch_size=batch) -> (outputs, new local_state):
  every slot's state row lives on the device that trains it (resident layout,
  leaves [local, ...] aligned with args), so rows are read and written in place
  of the slot, with nothing gathered or exchanged between devices. `sums` as
  in map_clients_with_state."""
  # The table is the loop's carry, each group's rows updated in place: as scanned
  # inputs and stacked outputs it cost a fresh zeroed table and a copy per round.
  def step(table, chunk):
    chunk_args, slot = chunk
    size = slot.shape[0]
    rows = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, slot[0], size), table)
    out, new_rows = _vmap_clients(fn)(chunk_args, rows)
    table = jax.tree.map(lambda a, r: jax.lax.dynamic_update_slice_in_dim(a, r, slot[0], 0),
                         table, new_rows)
    return table, out

  local = jax.tree.leaves(args)[0].shape[0]
  return _map_with_table(step, local_state, (args, jnp.arange(local)), batch, sums)


def deal_by_size(ids: jax.Array, mask: jax.Array, client_count: jax.Array, n_dev: int,
                 slots: int) -> tuple[jax.Array, jax.Array]:
  """Orders the cohort for the devices: [slots] ids and mask, `slots` a multiple of n_dev.

  Clients are sorted by size and dealt round-robin, so device d gets ranks
  d, d + n_dev, ... as one contiguous block: every device gets a similar
  amount of work, and within a device neighbours have similar sizes (a
  `lax.map` group runs as many steps as its largest client). Aggregation is a
  weighted sum, so the order changes no result beyond float rounding.
  """
  pad = slots - ids.shape[0]
  ids, mask = jnp.pad(ids, (0, pad)), jnp.pad(mask, (0, pad))
  size = jnp.where(mask, client_count[ids], -1)
  # ties by id: the same cohort is dealt the same way whatever order it was drawn in
  order = jnp.lexsort((ids, size)).reshape(slots // n_dev, n_dev).T.reshape(-1)
  return ids[order], mask[order]


def _client_hparams(hp: dict, round_index, *, schedule: str, rounds: int, momentum: bool,
                    local_dp: bool) -> dict:
  """What the client phase reads of the hyperparameters this round: the lr, the
  local terms' and the aggregator's numbers, momentum and local DP's noise."""
  out = {"lr": round_learning_rate(hp, round_index, schedule, rounds), "terms": hp["terms"],
         "aggregator": hp["aggregator"]}
  if momentum:
    out["momentum"] = hp["momentum"]
  if local_dp:
    out["update_noise"] = hp["update_noise"]
  return out


def _server_step(opt, delta, params, opt_state, *, frozen: bool, keep):
  """The server optimizer on the pseudo-gradient -delta; `frozen` (SOLO: no
  aggregation) never moves the model, `keep` (traced) holds model and optimizer
  state, momentum included, where the round released nothing to apply."""
  updates, new_state = opt.update(jax.tree.map(jnp.negative, delta), opt_state, params)
  new_params = optax.apply_updates(params, updates)
  if frozen:
    return params, opt_state
  return jax.tree.map(lambda old, new: jnp.where(keep, old, new), (params, opt_state),
                      (new_params, new_state))


def build_simulation(cfg: Config, model: Model, store: FederatedStore,
                     mesh: Mesh | None = None, feature_tiers=None,
                     client_budgets=None, resident_state: bool | None = None,
                     calibrated: float | None = None,
                     task: losses.Task | None = None) -> Simulation:
  """`feature_tiers` [features]: the data's sensitivity tiers, for clip_parts 'tiers';
  `client_budgets` [num_clients]: per-client target epsilons (local DP).
  `task`: the training loss and evaluation metrics (losses.py; default classification).

  `resident_state` (default: whenever every client takes part in every round and
  there is per-client state): the cohort is then the same every round and so is
  its dealing to the devices, so inside a compiled chunk each device keeps the
  state rows of the clients it trains (sharded over "clients", in dealing
  order) and no row crosses devices. That is the simulation's working layout:
  `run_working` keeps it from chunk to chunk, `run_rounds` converts from and to
  client order (replicated) at the ends of its chunk. Same numbers either
  way; False forces the replicated table (map_clients_with_state).
  `calibrated`: see make_privacy."""
  mesh = mesh or make_mesh(cfg.devices)
  n_dev = mesh.devices.size
  if cfg.sampling == "fixed":
    capacity = cfg.clients_per_round
  else:
    capacity = cfg.max_cohort or default_max_cohort(cfg.num_clients, cfg.clients_per_round)
  padded_capacity = int(math.ceil(capacity / n_dev) * n_dev)
  parallelism = cfg.client_parallelism
  if parallelism == "auto":
    parallelism = "map" if mesh.devices.flat[0].platform == "cpu" else "vmap"

  has_client_state = bool(jax.tree.leaves(
      jax.eval_shape(lambda: init_state(cfg, model).client_state)))
  full_participation = cfg.sampling == "fixed" and cfg.clients_per_round == cfg.num_clients
  if resident_state is None:
    resident_state = full_participation and has_client_state
  if resident_state and not full_participation:
    raise ValueError("resident_state needs every client in every round (sampling fixed, "
                     f"clients_per_round = num_clients = {cfg.num_clients})")
  if resident_state:
    # the dealing every round draws: deal_by_size breaks ties by id, so the draw's
    # order does not matter
    every = jnp.arange(cfg.num_clients, dtype=jnp.int32)
    home_ids, home_mask = (np.asarray(a) for a in deal_by_size(
        every, jnp.ones_like(every, bool), store.client_count, n_dev, padded_capacity))
    home_pos = np.zeros(cfg.num_clients, np.int32)   # client -> its slot
    home_pos[home_ids[home_mask]] = np.flatnonzero(home_mask)

  privacy = make_privacy(cfg, model, feature_tiers, calibrated)
  if client_budgets is not None:
    privacy = dataclasses.replace(privacy, client_budgets=np.asarray(client_budgets, np.float64))
  task = task or losses.CLASSIFICATION
  objective = objectives.make_objective(cfg, task.loss)
  aggregator = robust.get_aggregator(cfg.aggregator)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  client_pipeline = pipeline_lib.make_client_pipeline(cfg, d)
  train_one = partial(client_lib.local_train, apply_fn=model.apply, epochs=cfg.local_epochs,
                      batch_size=cfg.batch_size)
  dp = dp_round.make_dp_round(privacy, cfg.num_clients, cfg.clients_per_round,
                              cfg.cluster_noise == "equalize", SERVER_NOISE, CLIP_COUNT_NOISE,
                              LOCAL_NOISE)
  client_phase = jax.shard_map(
      partial(_client_phase, train_one=train_one, objective=objective, model=model,
              dp_client=dp.client,
              parallelism=parallelism, client_batch=cfg.client_batch, privacy=privacy,
              client_pipeline=client_pipeline, shuffle=cfg.shuffle == "layerwise",
              aggregate_noise=(client_pipeline is not None and cfg.kept_noise != "none"
                               and pipeline_lib.kept_noise_draw(cfg) == "aggregate"),
              # the config's hyperparameters, bound here (the seam for passing them
              # as traced data: aggregate's last argument)
              robust_aggregator=(None if aggregator.linear
                                 else aggregator.aggregate),
              malicious=(attacks.malicious_clients(cfg.num_clients, cfg.byzantine_fraction,
                                                   cfg.seed)
                         if cfg.byzantine_fraction > 0 else None),
              attack=(cfg.byzantine_attack, cfg.byzantine_scale),
              cluster_threshold=(cfg.cluster_threshold if cfg.cluster_noise == "equalize"
                                 else None),
              resident=resident_state,
              guard_nonfinite=client_pipeline is not None and (privacy.mode != "none"
                                                              or cfg.kept_noise != "none"),
              # only a refused client's row must survive: the replicated table
              # drops non-participants' writes, resident padding rows are junk
              keep_rows=resident_state and (privacy.stop_in_round or (
                  privacy.mode == "local" and privacy.target_epsilon is not None))),
      mesh=mesh,
      in_specs=(P(), P("clients"), P("clients"), P(), P(), P(), P(), P(),
                P("clients") if resident_state else P(), P(), P(), P(), P(), P()),
      out_specs=(P(), P(), P("clients") if resident_state else P(), P(), P(), P()))

  if resident_state:   # everyone, each on the device that holds its state
    sample = lambda key, client_count: (jnp.asarray(home_ids), jnp.asarray(home_mask),
                                        jnp.int32(0))
  else:
    def sample(key, client_count):
      cohort = sample_cohort(key, cfg.num_clients, cfg.clients_per_round, cfg.sampling, capacity)
      ids, mask = deal_by_size(cohort.ids, cohort.mask, client_count, n_dev, padded_capacity)
      return ids, mask, cohort.overflow
  server_stages = server_stages_lib.make_server_stages(cfg, privacy.mode != "none", DOWNLINK)
  client_hparams = partial(_client_hparams, schedule=cfg.lr_schedule, rounds=cfg.rounds,
                           momentum=cfg.momentum > 0, local_dp=privacy.mode == "local")
  server_optimizer = partial(server_lib.make_server_optimizer, cfg)
  objective_server_step = lambda server_state, contrib, hp: objective.server_step(
      server_state, contrib, cfg.num_clients, hp=hp)
  # central DP applies a round nobody took part in (its noise was released and
  # accounted); otherwise such a round (empty Poisson draw, all spent) applies nothing
  keep_if = ((lambda adm, stats: adm.skip) if privacy.mode == "central"
             else (lambda adm, stats: stats.participants == 0))
  server_context = lambda adm, stats: objectives.ServerContext(
      num_clients=cfg.num_clients,
      cohort_size=cfg.clients_per_round if privacy.mode == "central" else stats.participants,
      applied=~keep_if(adm, stats))

  def round_fn(state: SimState, store: FederatedStore, hp: dict) -> tuple[SimState, RoundStats]:
    """planner -> sampling -> admission -> clients -> aggregate -> server stages ->
    server optimizer; the ledger composes what the round applied."""
    round_key = jax.random.fold_in(state.key, state.round)
    plan = dp.plan(state, hp)
    ids, mask, overflow = sample(jax.random.fold_in(round_key, COHORT_SAMPLING),
                                 store.client_count)
    adm = dp.admit(state, ids, mask, plan, hp)
    clip_norm = dp.clip_norm(state, hp)
    delta, stats, client_state, contrib_sum, cluster_info, agg_slots = client_phase(
        state.params, ids, adm.mask, client_hparams(hp, state.round), round_key, clip_norm,
        plan.scales, adm.factor, state.client_state, state.server_state, store.x, store.y,
        store.client_index, store.client_count)
    server_state = {**objective_server_step(state.server_state, contrib_sum, hp=hp["terms"]),
                    **agg_slots}
    delta, ledger, clip_norm, event = dp.release(delta, state, plan, adm, ids,
                                                 stats.participants, stats.unclipped,
                                                 round_key, clip_norm, hp)
    stats = stats._replace(spent=adm.spent, event=event)
    # the local terms' change to the released update (FedDyn's -h / alpha; none for
    # the others): post-processing of the release
    delta, server_state = objective.server_update(delta, server_state,
                                                  server_context(adm, stats), hp=hp["terms"])
    ctx = server_stages_lib.RoundContext(round_key, hp, ids, adm.mask, stats.participants,
                                         adm.skip, ~keep_if(adm, stats), cluster_info)
    delta, server_state = server_stages.update(delta, server_state, ctx)
    params, opt_state = _server_step(server_optimizer(hp["server_lr"], hp.get("server_momentum")),
                                     delta, state.params, state.server_opt_state,
                                     frozen=objective.solo, keep=keep_if(adm, stats))
    return state._replace(round=state.round + 1, params=params, server_opt_state=opt_state,
                          participations=state.participations + stats.participants,
                          cohort_overflow=state.cohort_overflow + overflow, ledger=ledger,
                          clip_norm=clip_norm, client_state=client_state,
                          server_state=server_state), stats

  @partial(jax.jit, static_argnums=(3,), donate_argnums=(0,))
  def run_chunk(state: SimState, store: FederatedStore, hp: dict, length: int):
    return jax.lax.scan(lambda s, _: round_fn(s, store, hp), state, None, length=length)

  layouts = {}
  if resident_state:
    # client order, replicated <-> dealing order, each device its own slots' rows
    to_slots = jax.jit(lambda table: jax.tree.map(
        lambda a: jax.lax.with_sharding_constraint(a[home_ids], NamedSharding(mesh, P("clients"))),
        table), donate_argnums=(0,))
    to_clients = jax.jit(lambda table: jax.tree.map(
        lambda a: jax.lax.with_sharding_constraint(a[home_pos], NamedSharding(mesh, P())),
        table))
    layouts = dict(
        to_working=lambda state: state._replace(client_state=to_slots(state.client_state)),
        to_client_order=lambda state: state._replace(
            client_state=to_clients(state.client_state)))

  store = jax.device_put(store, NamedSharding(mesh, P()))
  host_hp = hparams_lib.round_hparams(cfg, privacy)
  hp = jax.device_put(jax.tree.map(jnp.asarray, host_hp), NamedSharding(mesh, P()))
  return Simulation(cfg=cfg, model=model, store=store, mesh=mesh,
                    cohort_capacity=padded_capacity, client_parallelism=parallelism,
                    run_chunk=run_chunk, evaluate=make_evaluate(model, task), privacy=privacy,
                    hparams=hp, feature_tiers=feature_tiers, calibrated=calibrated,
                    issued={hparams_lib.digest(host_hp)}, **layouts)


def sampling_rate(cfg: Config) -> float:
  """The rate a client joins a round with: m / N (fixed-size cohorts), or under
  Poisson sampling the rate `sample_cohort` really draws with, which the
  accountant charges (`poisson_rate_used`)."""
  q = cfg.clients_per_round / cfg.num_clients
  return poisson_rate_used(q) if cfg.sampling == "poisson" else q


def poisson_rate_used(q: float) -> float:
  """P(u < float32(q)) for jax.random.bernoulli's u, uniform on the grid j / 2^23
  (float32 mantissa bits), j = 0 .. 2^23 - 1: ceil(float32(q) 2^23) / 2^23, exact
  in float64. It differs from q by at most 2^-23 (e.g. 0.1 -> 0.10000002384)."""
  return min(1.0, math.ceil(float(np.float32(q)) * 2.0 ** 23) / 2.0 ** 23)


budget_limit = hparams_lib.budget_limit


def make_privacy(cfg: Config, model: Model, feature_tiers=None,
                 calibrated: float | None = None) -> Privacy:
  """Resolves the config's DP keys: clip layout, noise multipliers, the accounted event.

  `calibrated`: under central DP with target_epsilon, the accounted multiplier to
  use instead of calibrating from round 0 (a resumed run keeps the multiplier its
  rounds were calibrated to; see runner.calibrated_multiplier)."""
  if cfg.dp == "none":
    return Privacy()
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  if cfg.clip_parts == "tiers":
    from fedjax_dp.data.tabular import TIERS
    if feature_tiers is None:
      raise ValueError("clip_parts 'tiers' needs data with sensitivity tiers (dataset "
                       "healthcare, or csv with tier_map_path)")
    layout = mechanisms.tier_layout(shapes, feature_tiers, TIERS.index(cfg.rest_tier),
                                    cfg.tier_noise_multipliers)
  else:
    layout = mechanisms.clip_layout(shapes, cfg.clip_parts)
  tier_scales = layout.noise_scales or (1.0,) * len(layout.fractions)
  # z_accounted = z * ratio(score): the composed parts' multiplier at controller output
  # `score`; the noise is least, the ratio smallest, at score 1
  ratio = lambda score: accounting.effective_noise_multiplier(mechanisms.part_noise_multipliers(
      layout._replace(noise_scales=tuple(np.asarray(noise_control.noise_scales(
          cfg.noise_schedule, score, tier_scales, cfg.convergence_beta), np.float64))), 1.0))
  if cfg.noise_multiplier is None and cfg.dp == "central":
    # calibrate the accounted multiplier to target_epsilon, then the base z so that
    # even the least-noise rounds (score 1) stay within it
    z = (noise_multiplier_for(cfg) if calibrated is None else calibrated) / ratio(1.0)
  else:
    z = noise_multiplier_for(cfg)
  count_stddev = 0.0
  z_update = z
  # per-part bounds with isotropic noise compose to one Gaussian with multiplier z
  z_accounted = accounting.effective_noise_multiplier(
      mechanisms.part_noise_multipliers(layout, z)) if z > 0 else 0.0
  if cfg.adaptive_clipping and z > 0:
    # the count query is one more Gaussian on the same record (sensitivity 1/2,
    # multiplier 2 s); the updates' noise is raised so that the pair composes to
    # z_accounted, whatever the parts' weights (tiers: z_accounted = z / sqrt(S))
    weight = (z / z_accounted) ** 2     # S = sum_p (f_p / scale_p)^2
    count_stddev = clip_count_stddev(cfg, z_accounted)
    try:
      z_update = mechanisms.update_noise_multiplier(z, count_stddev, weight)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    # composed from the noise actually applied, not assumed: (S / z_u^2 + 1/(2 s)^2)^(-1/2)
    z_accounted = accounting.effective_noise_multiplier(
        mechanisms.part_noise_multipliers(layout, z_update) + [2.0 * count_stddev])
  event = (local_event_rdp(cfg, z_accounted) if cfg.dp == "local"
           else round_event_rdp(cfg, z_accounted))
  table = None
  multipliers = (z_accounted,)
  if cfg.dp == "central" and cfg.noise_schedule != "static" and z > 0:
    # (config.py refuses adaptive clipping with a schedule: no count part here)
    multipliers = tuple(z * ratio(k / (SCORE_GRID - 1)) for k in range(SCORE_GRID))
    table = np.stack([accounting.event_to_float32(round_event_rdp(cfg, m)) for m in multipliers])
  return Privacy(mode=cfg.dp, layout=layout, update_noise_multiplier=z_update,
                 noise_multiplier=z, accounted_noise_multiplier=z_accounted, event_rdp=event,
                 target_epsilon=cfg.target_epsilon,
                 delta=cfg.delta, adaptive=cfg.adaptive_clipping, count_stddev=count_stddev,
                 schedule=cfg.noise_schedule, event_table=table, event_multipliers=multipliers,
                 stop_in_round=(cfg.dp == "central" and cfg.target_epsilon is not None
                                and (cfg.clip_parts == "tiers" or cfg.noise_schedule != "static")))


def clip_count_stddev(cfg: Config, accounted_multiplier: float) -> float:
  """Std of the noise on the clipped count. Default: Andrew et al.'s m / 20, raised
  to the accounted noise multiplier where that is larger (small cohorts, or tiers
  whose composed multiplier is above z), so that the updates' noise grows by at
  most (1 - 1/4)^(-1/2) = 1.155x."""
  if cfg.clip_count_stddev is not None:
    return cfg.clip_count_stddev
  return max(cfg.clients_per_round / 20.0, accounted_multiplier)


def local_event_rdp(cfg: Config, noise_multiplier: float) -> np.ndarray:
  """RDP of one participation under local DP: the client's own clipped update
  with N(0, (z C)^2), released whole (no amplification by sampling), replace-one
  (sensitivity 2C, so multiplier z / 2). Infinite without noise."""
  if noise_multiplier == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  return accounting.gaussian_rdp(noise_multiplier / 2)


def round_event_rdp(cfg: Config, noise_multiplier: float) -> np.ndarray:
  """RDP of one central-DP round, N(0, (z C)^2) on the sum of updates clipped to C:
    sampling 'poisson': Poisson-subsampled Gaussian, add/remove-one client
      (sensitivity C, multiplier z);
    sampling 'fixed': exactly clients_per_round of num_clients without replacement,
      replace-one client (sensitivity 2C, so multiplier z / 2; WBK 2019).
  Infinite without noise."""
  return _round_event_rdp(cfg.sampling, cfg.clients_per_round, cfg.num_clients,
                          float(noise_multiplier)).copy()


@functools.lru_cache(maxsize=4096)
def _round_event_rdp(sampling: str, per_round: int, num_clients: int, z: float) -> np.ndarray:
  """round_event_rdp by the values it depends on (cached: a calibration and a noise
  schedule's table each evaluate dozens of curves, at 0.1-0.2 s each)."""
  if z == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  if sampling == "fixed":
    return accounting.fixed_size_gaussian_rdp(per_round, num_clients, z / 2)
  q = per_round / num_clients
  return accounting.poisson_gaussian_rdp(poisson_rate_used(q), z)


def neighbouring_relation(cfg: Config) -> str:
  if cfg.sampling == "fixed":
    return "replace one client (fixed-size cohorts; sensitivity 2 clip_norm)"
  return "add/remove one client (Poisson sampling; sensitivity clip_norm)"


@functools.lru_cache(maxsize=16)
def noise_multiplier_for(cfg: Config) -> float:
  """The configured noise multiplier, or the one that reaches target_epsilon in `rounds`.

  It aims a hair below the target (1e-5 relative, plus the in-round float32
  ledger's worst-case upward drift of 3e-7 per round), so that the budget check,
  which sees the rounded-up ledger, lets all `rounds` rounds run."""
  if cfg.noise_multiplier is not None:
    return cfg.noise_multiplier
  aim = cfg.target_epsilon * (1.0 - 1e-5 - 3e-7 * cfg.rounds)
  return accounting.calibrate_noise_multiplier(
      aim, sampling_rate(cfg), cfg.rounds, cfg.delta,
      epsilon_fn=lambda z: accounting.epsilon_np(cfg.rounds * round_event_rdp(cfg, z),
                                                 cfg.delta)[0])


def make_solo_evaluate(model: Model) -> Callable:
  """SOLO's accuracy: the mean over clients of each client's own model's accuracy on
  the test set, reweighted to the client's label distribution,
    acc_i = sum_k p_ik correct_ik / n_k,
  (and the same for the loss). client_models: leaves [N, ...]; label_dist [N, K]."""
  @jax.jit
  def evaluate(client_models, xb, yb, mb, label_dist):
    num_classes = label_dist.shape[1]
    onehot = jax.nn.one_hot(yb, num_classes) * mb[..., None]         # [nb, b, K]
    per_class_n = jnp.maximum(jnp.sum(onehot, axis=(0, 1)), 1.0)      # [K]

    def one_client(args):
      p, dist = args
      def batch(a):
        x, y, oh = a
        logits = model.apply(p, x)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        correct = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
        return correct @ oh, ce @ oh                                   # [K], [K]
      correct, loss = jax.lax.map(batch, (xb, yb, onehot))
      return (dist @ (jnp.sum(correct, 0) / per_class_n),
              dist @ (jnp.sum(loss, 0) / per_class_n))
    acc, loss = jax.lax.map(one_client, (client_models, label_dist))
    return jnp.mean(acc), jnp.mean(loss)
  return evaluate


def make_evaluate(model: Model, task: losses.Task | None = None) -> Callable:
  """(params, x [nb, b, ...], y [nb, b, ...], mask [nb, b]) -> {name: mean over the
  real test examples} for each of the task's metrics (classification: accuracy, loss)."""
  metrics = tuple((task or losses.CLASSIFICATION).metrics.items())
  # 'loss' computed first: for classification this is the program evaluation
  # always compiled to, so the test metrics of earlier runs stay bit for bit
  order = sorted(metrics, key=lambda kv: kv[0] != "loss")

  @jax.jit
  def evaluate(params, xb, yb, mb):
    def one(args):
      x, y, m = args
      outputs = model.apply(params, x)
      values = [fn(outputs, y) for _, fn in order]
      mf = m.astype(jnp.float32)
      return tuple(jnp.sum(v * mf) for v in values)
    sums = dict(zip((name for name, _ in order), jax.lax.map(one, (xb, yb, mb))))
    n = jnp.maximum(jnp.sum(mb), 1)
    return {name: jnp.sum(sums[name]) / n for name, _ in metrics}
  return evaluate


def batch_for_eval(x: np.ndarray, y: np.ndarray, batch: int, y_dtype: str | None = None):
  """Pads a test set to whole batches: x [nb, b, ...], y [nb, b, ...], mask [nb, b].

  y keeps its kind (store.target_dtype: int32 labels, float32 real targets)
  unless y_dtype says otherwise."""
  n = len(y)
  b = min(batch, max(n, 1))
  nb = max(1, math.ceil(n / b))
  pad = nb * b - n
  xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]).reshape((nb, b) + x.shape[1:])
  yp = np.concatenate([y, np.zeros((pad,) + y.shape[1:], y.dtype)]).reshape((nb, b) + y.shape[1:])
  mp = (np.arange(nb * b) < n).reshape(nb, b)
  return (jnp.asarray(xp, jnp.float32), jnp.asarray(yp, target_dtype(y, y_dtype)),
          jnp.asarray(mp))
