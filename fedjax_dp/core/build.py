"""build_simulation: a run's stages resolved once (the privacy mechanism, the client
stages, the aggregator, the executor, the cohort sampler) and its round compiled
(core/round.py) into a Simulation (core/simulation.py)."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp import losses
from fedjax_dp import recipes
from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.config.schema import data_seed
from fedjax_dp.recipes import hparams as hparams_lib
from fedjax_dp.core import one_step
from fedjax_dp.core.client_phase import ClientStages
from fedjax_dp.core.evaluate import make_evaluate
from fedjax_dp.core.state import (BYZANTINE, BYZANTINE_DRAW, CLIP_COUNT_NOISE, COHORT_SAMPLING,
                                  LOCAL_NOISE, SERVER_NOISE, SimState, init_state)
from fedjax_dp.models import Model
from fedjax_dp.placement import cohort as cohort_lib
from fedjax_dp.placement import paged_state
from fedjax_dp.placement.executor import Executor, plan_executor
from fedjax_dp.placement.store import FederatedStore, default_max_cohort
from fedjax_dp.adversary import audit
from fedjax_dp.privacy import boundary
from fedjax_dp.privacy import dp_round
from fedjax_dp.recipes import release_identity
from fedjax_dp.recipes.privacy import make_privacy
from fedjax_dp.adversary import attacks
from fedjax_dp.training import client as client_lib
from fedjax_dp.core.round import make_round
from fedjax_dp.core.simulation import Simulation, make_mesh


def build_simulation(cfg: Config, model: Model, store: FederatedStore,
                     mesh: Mesh | None = None, feature_tiers=None,
                     client_budgets=None, resident_state: bool | None = None,
                     calibrated: float | None = None,
                     task: losses.Task | None = None,
                     poisoned_offset: int | None = None) -> Simulation:
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
  way; False forces the table that follows the cohort: sharded in blocks of ids
  over several devices, whole on one (executor.map_clients_with_sharded_state,
  map_clients_with_state).
  `calibrated`: see make_privacy. `poisoned_offset`: the store's row where the
  poisoned copy of every client's data starts (a data attack drawn each round:
  experiment/setup.py puts the copy after the clean rows)."""
  mesh = mesh or make_mesh(cfg.devices)
  n_dev = mesh.devices.size
  # before the store is placed: one pass over the host's copy of the data
  inputs = release_identity.inputs_digest(store, model if cfg.model == "custom" else None, task,
                                          feature_tiers, client_budgets)
  capacity = (cfg.clients_per_round if cfg.sampling == "fixed" else
              cfg.max_cohort or default_max_cohort(cfg.num_clients, cfg.clients_per_round))
  slots = int(math.ceil(capacity / n_dev) * n_dev)
  recipe = recipes.from_config(cfg)   # the run's stages (config validation read the same)
  setup = recipes.run_setup(cfg)      # and the rest of the run
  privacy, dp = _privacy_and_round(make_privacy(cfg, model, feature_tiers, calibrated),
                                   setup.population, cfg.cluster_noise == "equalize",
                                   client_budgets)
  aggregator = recipe.rule
  byzantine = attacks.make_byzantine(cfg.num_clients, cfg.byzantine_fraction, data_seed(cfg),
                                     cfg.byzantine_attack, cfg.byzantine_scale, BYZANTINE,
                                     cfg.byzantine_draw, BYZANTINE_DRAW)
  full_participation = cfg.sampling == "fixed" and cfg.clients_per_round == cfg.num_clients
  shape = jax.eval_shape(lambda: init_state(setup, recipe, model, jax.random.PRNGKey(0)))
  per_client_state = bool(jax.tree.leaves(shape.client_state))
  # a stage that needs the cohort's uploads stacked (DP's client half, one upload
  # at a time, runs inside the client loop's sum)
  stacks_uploads = (byzantine is not None or not aggregator.linear
                      or cfg.server_clip_l2 is not None or cfg.audit_canaries > 0)
  paged = cfg.client_state_store != "device"
  if paged:
    _check_paging(cfg.client_state_store, per_client_state, resident_state)
  width = _one_step_width(setup, recipe, store, per_client_state,
                          stacks_uploads or dp.client is not None, cfg.shuffle == "layerwise")
  executor = plan_executor(
      mesh, parallelism=cfg.client_parallelism, client_batch=cfg.client_batch, slots=slots,
      num_clients=cfg.num_clients, full_participation=full_participation,
      per_client_state=per_client_state, resident=resident_state,
      refuses_clients=dp.refuses_clients, stacks_uploads=stacks_uploads,
      one_step_width=width, paged=paged)
  poisoned_rows = attacks.make_data_redraw(cfg.num_clients, cfg.byzantine_fraction,
                                           cfg.byzantine_attack, cfg.byzantine_draw,
                                           poisoned_offset or 0, BYZANTINE_DRAW)
  if poisoned_rows is not None and poisoned_offset is None:
    raise ConfigError(f"config key 'byzantine_attack' = {cfg.byzantine_attack!r} with "
                      "byzantine_draw 'round' needs the store to hold every client's poisoned "
                      "data after the clean rows and build_simulation(poisoned_offset=) to "
                      "say where it starts (experiment/setup.py builds both)")
  stages = _client_stages(
      recipe, setup.training, model, task or losses.CLASSIFICATION, dp, aggregator, executor,
      byzantine=byzantine, attack=attacks.placement(cfg.byzantine_attack),
      poisoned_rows=poisoned_rows,
      canary=audit.make_canary_stage(cfg.num_clients, cfg.audit_canaries, data_seed(cfg)),
      server_clip=cfg.server_clip_l2, cluster_noise=cfg.cluster_noise == "equalize",
      shuffle=cfg.shuffle == "layerwise")
  home = (cohort_lib.home_slots(cfg.num_clients, store.client_count, n_dev, slots)
          if executor.resident and not paged else None)
  sample = cohort_lib.make_sampler(
      resident=home is not None, num_clients=cfg.num_clients,
      clients_per_round=cfg.clients_per_round, sampling=cfg.sampling, capacity=capacity,
      n_dev=n_dev, slots=slots, home=home)
  round_fn = make_round(setup, recipe, mesh, stages, dp, sample)
  paging = paged_state.make_paging(
      partial(_round_cohort, sample), mesh, cfg.num_clients, kind=cfg.client_state_store,
      dtype=cfg.client_state_dtype, directory=cfg.client_state_dir) if paged else None

  run_chunk, run_replica_chunk = _compiled_chunks(round_fn, cfg.matmul_precision)
  replicated = NamedSharding(mesh, P())
  store = jax.device_put(store, replicated)
  host_hp = hparams_lib.round_hparams(cfg, privacy, recipe)
  hp = jax.device_put(jax.tree.map(jnp.asarray, host_hp), replicated)
  layouts = _layouts(mesh, home, cfg.num_clients, executor.table_rows)
  return Simulation(cfg=cfg, model=model, store=store, mesh=mesh, cohort_capacity=slots,
                    client_parallelism=executor.parallelism, run_chunk=run_chunk,
                    run_replica_chunk=run_replica_chunk,
                    evaluate=make_evaluate(model, task, cfg.matmul_precision), privacy=privacy, hparams=hp,
                    feature_tiers=feature_tiers, calibrated=calibrated,
                    issued={hparams_lib.digest(host_hp): cfg}, paging=paging,
                    inputs_digest=inputs, recipe=recipe, setup=setup, **layouts)


def _privacy_and_round(privacy, population, cluster_noise: bool, client_budgets):
  """(Privacy with the per-client budgets, the DP round's parts) of this run."""
  if client_budgets is not None:
    privacy = dataclasses.replace(privacy, client_budgets=np.asarray(client_budgets, np.float64))
  dp = dp_round.make_dp_round(privacy, population.num_clients, population.clients_per_round,
                              cluster_noise, SERVER_NOISE, CLIP_COUNT_NOISE, LOCAL_NOISE)
  return privacy, dp


def _one_step_width(setup: recipes.RunSetup, recipe, store: FederatedStore,
                    per_client_state: bool, inspects_uploads: bool, uniform_weights: bool) -> int:
  """one_step.one_step_width for this run; client_parallelism 'one_step' where it
  does not apply is a ConfigError with the reason."""
  width, why = one_step.one_step_width(
      epochs=setup.training.epochs, batch_size=setup.training.batch_size,
      client_count=store.client_count,
      local_terms=tuple(c.stage.name for c in recipe.terms), upload_stages=bool(recipe.upload),
      per_client_state=per_client_state, inspects_uploads=inspects_uploads,
      uniform_weights=uniform_weights)
  if setup.execution.client_parallelism == "one_step" and why:
    raise ConfigError(f"config key 'client_parallelism' = 'one_step': {why}; it needs every "
                      "client's local work to be one plain SGD step (README: Performance and scale)")
  return width


def _layouts(mesh: Mesh, home, num_clients: int, table_rows) -> dict:
  """The per-client state table's layout: resident rows (`home`), blocks of ids
  sharded over the devices, or none."""
  if home is not None:
    return cohort_lib.resident_layout(mesh, home)
  return cohort_lib.sharded_layout(mesh, num_clients, table_rows) if table_rows else {}


def _check_paging(store_kind: str, per_client_state: bool, resident_state) -> None:
  """A host or disk table of per-client state (client_state_store) needs state to
  hold, one process, and the resident layout."""
  if not per_client_state:
    raise ConfigError(f"config key 'client_state_store' = {store_kind!r}: this run "
                      "keeps no per-client state (the store would hold nothing); leave it "
                      "'device'")
  if jax.process_count() > 1:
    raise ConfigError(f"config key 'client_state_store' = {store_kind!r} with "
                      f"{jax.process_count()} processes: a host or disk table is one process's; "
                      "leave it 'device' (the table is then sharded over all processes)")
  if resident_state is False:
    raise ConfigError(f"resident_state=False with client_state_store "
                      f"{store_kind!r}: a host table's page is resident")


def _compiled_chunks(round_fn, matmul_precision: str):
  """(run_chunk, run_replica_chunk): `length` rounds of round_fn as one compiled scan,
  for one state, and for stacked replicas' states and hyperparameters (vmapped)."""
  # the precision is read when a program is traced: inside the jitted bodies, it holds
  # for this simulation's programs alone (JAX's own GPU default would be tensorfloat32)
  precision = partial(jax.default_matmul_precision, matmul_precision)

  @partial(jax.jit, static_argnums=(3,), donate_argnums=(0,))
  def run_chunk(state: SimState, store: FederatedStore, hp: dict, length: int):
    with precision():
      return jax.lax.scan(lambda s, _: round_fn(s, store, hp), state, None, length=length)

  @partial(jax.jit, static_argnums=(3,), donate_argnums=(0,))
  def run_replica_chunk(states: SimState, store: FederatedStore, hps: dict, length: int):
    with precision():
      return jax.vmap(lambda s, hp: jax.lax.scan(lambda c, _: round_fn(c, store, hp), s, None,
                                                 length=length))(states, hps)

  return run_chunk, run_replica_chunk


def _client_stages(recipe: recipes.Recipe, training: recipes.LocalTraining, model: Model,
                   task: losses.Task, dp: dp_round.DPRound, aggregator, executor: Executor, *,
                   byzantine, attack, poisoned_rows, canary, server_clip: float | None,
                   cluster_noise: bool, shuffle: bool) -> ClientStages:
  """The client phase's stages: the recipe's, with the run's attacks (`attack`: their
  placement), canaries, server norm bound, cluster noise and shuffling."""
  client_pipeline = recipe.client_pipeline()
  return ClientStages(
      train_one=partial(client_lib.local_train, apply_fn=model.apply, epochs=training.epochs,
                        batch_size=training.batch_size),
      objective=recipe.objective(task.loss, training.momentum), model=model,
      pipeline=client_pipeline, dp=dp, byzantine=byzantine, server_clip=server_clip,
      # an attack acts on the report sent: before a server's clip, after a client's
      byzantine_before_mechanism=byzantine is not None and boundary.before_boundary(
          recipe.privacy.stage.boundary if recipe.privacy is not None else None, attack),
      poisoned_rows=poisoned_rows, canary=canary,
      aggregator=None if aggregator.linear else aggregator.aggregate,
      cluster_noise=cluster_noise, shuffle=shuffle,
      aggregate_noise=any(c.stage.owes_noise for c in recipe.upload),
      guard_nonfinite=client_pipeline is not None and (dp.client is not None
                                                      or any(c.stage.privatizes
                                                             for c in recipe.upload)),
      executor=executor)


def _round_cohort(sample: Callable, key, r, client_count):
  """The ids and mask round r of run key `key` draws (as round_fn does)."""
  ids, mask, _ = sample(jax.random.fold_in(jax.random.fold_in(key, r), COHORT_SAMPLING),
                        client_count)
  return ids, mask
