"""build_simulation: a run's stages resolved once (the privacy mechanism, the client
stages, the aggregator, the executor, the cohort sampler) and its round compiled
(core/round.py) into a Simulation (core/simulation.py)."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp import losses
from fedjax_dp import recipes
from fedjax_dp.errors import ConfigError
from fedjax_dp.core import low_rank_steps, one_step
from fedjax_dp.core import upload_stages
from fedjax_dp.core.client_phase import ClientStages
from fedjax_dp.core.evaluate import make_evaluate
from fedjax_dp.core.state import (BYZANTINE, BYZANTINE_DRAW, CLIP_COUNT_NOISE, COHORT_SAMPLING,
                                  LOCAL_NOISE, SAMPLER_INIT, SERVER_NOISE, SimState, init_state)
from fedjax_dp.models import Model
from fedjax_dp.placement import cohort as cohort_lib
from fedjax_dp.placement import paged_state, participation
from fedjax_dp.placement.executor import Executor, plan_executor
from fedjax_dp.placement.store import FederatedStore, default_max_cohort
from fedjax_dp.adversary import audit
from fedjax_dp.privacy import boundary
from fedjax_dp.privacy import dp_round
from fedjax_dp.recipes import release_identity
from fedjax_dp.adversary import attacks
from fedjax_dp.training import client as client_lib
from fedjax_dp.core.round import make_round
from fedjax_dp.core.simulation import Simulation, make_mesh, release_of_numbers


def build_simulation(plan: recipes.RunPlan, model: Model, store: FederatedStore,
                     mesh: Mesh | None = None, *, resident_state: bool | None = None,
                     task: losses.Task | None = None,
                     poisoned_offset: int | None = None) -> Simulation:
  """The run `plan` describes (recipes.plan_run(cfg, model, ...): the config read
  once, at the edge) compiled for `model` on `store`. `task`: the training loss and
  evaluation metrics (losses.py; default classification).

  `resident_state` (default: whenever every client takes part in every round and
  there is per-client state): each device keeps the state rows of the clients it
  trains, in dealing order, and no row crosses devices (`run_working` keeps that
  layout from chunk to chunk, `run_rounds` converts to client order at its ends);
  False: the table follows the cohort (executor.map_clients_with_sharded_state,
  map_clients_with_state). Same numbers either way.
  `poisoned_offset`: the store's row where the poisoned copy of every client's data
  starts (a data attack drawn each round: experiment/setup.py puts the copy after
  the clean rows)."""
  recipe, setup, privacy = plan.recipe, plan.setup, plan.privacy
  ex, pop = setup.execution, setup.population
  mesh = mesh or make_mesh(ex.devices)
  n_dev = mesh.devices.size
  # before the store is placed: one pass over the host's copy of the data
  inputs = release_identity.inputs_digest(store, model if setup.model == "custom" else None,
                                          task, plan.feature_tiers, plan.client_budgets)
  capacity, slots = _cohort_room(pop, n_dev)
  dp = dp_round.make_dp_round(privacy, pop.num_clients, pop.clients_per_round,
                              recipe.rule.client_noise, SERVER_NOISE, CLIP_COUNT_NOISE,
                              LOCAL_NOISE)
  aggregator = recipe.rule
  full_participation = pop.sampling == "fixed" and pop.clients_per_round == pop.num_clients
  shape = jax.eval_shape(lambda: init_state(setup, recipe, model, jax.random.PRNGKey(0),
                                            privacy=privacy))
  per_client_state = bool(jax.tree.leaves(shape.client_state))
  uploads = _upload_chain(recipe, dp, setup)
  # a stage or rule that needs the cohort's uploads one by one stacks them (DP's
  # client half, one upload at a time, runs inside the client loop's sum)
  stacks_uploads = not aggregator.linear or upload_stages.inspects_uploads(uploads)
  paged = ex.client_state_store != "device"
  if paged:
    _check_paging(ex.client_state_store, per_client_state, resident_state)
  summed = _summed_reports(dp, stacks_uploads, ex.local_noise_draw)
  # one step clips from the clients' gradient norms; a report's own noise draw needs the loop
  conditions = dict(local_terms=tuple(c.stage.name for c in recipe.terms),
                    upload_stages=bool(recipe.upload), per_client_state=per_client_state,
                    inspects_uploads=stacks_uploads or (dp.report_noise is not None
                                                        and not summed),
                    uniform_weights=recipe.shuffle is not None)
  width = _one_step_width(setup, store, conditions)
  low_rank = (_low_rank_rows(setup, model, shape.params, store, conditions)
              if not width or ex.client_parallelism == "low_rank" else 0)
  executor = plan_executor(
      mesh, parallelism=ex.client_parallelism, client_batch=ex.client_batch, slots=slots,
      num_clients=pop.num_clients, full_participation=full_participation,
      per_client_state=per_client_state, resident=resident_state,
      refuses_clients=dp.refuses_clients, stacks_uploads=stacks_uploads,
      one_step_width=width, low_rank_rows=low_rank, paged=paged)
  stages = _client_stages(
      recipe, setup.training, model, task or losses.CLASSIFICATION, dp, aggregator, executor,
      uploads=uploads, poisoned_rows=_data_attack(setup.adversary, pop.num_clients,
                                                  poisoned_offset),
      summed_reports=summed, tap_dense=setup.model in TAPPED_MODELS)
  home, sampler = _sampler(pop, setup.training.rounds, store.client_count, n_dev, slots,
                           capacity, resident=executor.resident and not paged,
                           data_seed=setup.adversary.data_seed)
  round_fn = make_round(setup, recipe, mesh, stages, dp, sampler)
  paging = _paging(sampler, mesh, setup) if paged else None

  run_chunk, run_replica_chunk = _compiled_chunks(round_fn, ex.matmul_precision)
  replicated = NamedSharding(mesh, P())
  store = jax.device_put(store, replicated)
  hp = jax.device_put(jax.tree.map(jnp.asarray, plan.hparams), replicated)
  layouts = _layouts(mesh, home, pop.num_clients, executor.table_rows)
  return Simulation(plan=plan, model=model, store=store, mesh=mesh, cohort_capacity=slots,
                    sampler=sampler,
                    client_parallelism=executor.parallelism, run_chunk=run_chunk,
                    run_replica_chunk=run_replica_chunk,
                    evaluate=make_evaluate(model, task, ex.matmul_precision), hparams=hp,
                    issued={release_of_numbers(plan.hparams, plan): plan.cfg},
                    paging=paging,
                    inputs_digest=inputs, **layouts)


def _cohort_room(population: recipes.Population, n_dev: int) -> tuple[int, int]:
  """(capacity, slots): the most clients a round's cohort can hold (fixed-size: m;
  Poisson: max_cohort or the default margin), and that rounded up to whole devices."""
  p = population
  capacity = (p.max_cohort or default_max_cohort(p.num_clients, p.clients_per_round)
              if p.sampling in participation.RANDOM_COHORTS else p.clients_per_round)
  return capacity, int(math.ceil(capacity / n_dev) * n_dev)


def _sampler(population: recipes.Population, rounds: int, client_count, n_dev: int, slots: int,
             capacity: int, resident: bool, data_seed: int):
  """(home slots or None, the cohort sampler of the participation schema the
  accountant reads): resident, each client's slot is fixed."""
  p = population
  home = cohort_lib.home_slots(p.num_clients, client_count, n_dev, slots) if resident else None
  schema = participation.schema(p.sampling, p.num_clients, p.clients_per_round, rounds,
                                p.min_separation)
  return home, cohort_lib.make_sampler(resident=home is not None, schema=schema,
                                       capacity=capacity, n_dev=n_dev, slots=slots, home=home,
                                       data_seed=data_seed)


def _paging(sampler: cohort_lib.Sampler, mesh: Mesh, setup: recipes.RunSetup):
  """The host or disk table of per-client state (placement/paged_state.py)."""
  ex = setup.execution
  if not sampler.ahead:
    raise ConfigError(f"config key 'client_state_store' = {ex.client_state_store!r} with "
                      f"sampling {setup.population.sampling!r}: the paged table draws a round's "
                      "cohort ahead of the round, and this sampler's depends on the rounds "
                      "before; use client_state_store 'device' or another sampling")
  return paged_state.make_paging(
      partial(_round_cohort, sampler), mesh, setup.population.num_clients,
      kind=ex.client_state_store, dtype=ex.client_state_dtype, directory=ex.client_state_dir)


def _upload_chain(recipe: recipes.Recipe, dp: dp_round.DPRound,
                  setup: recipes.RunSetup) -> tuple:
  """The stages between training and the aggregate (core/upload_stages.chain): the
  set-up's canaries, Byzantine clients and server norm bound, the recipe's shuffler;
  an attack acts on the report sent: before a server's clip, after a client's."""
  a, n = setup.adversary, setup.population.num_clients
  byzantine = attacks.make_byzantine(n, a.byzantine_fraction, a.data_seed, a.byzantine_attack,
                                     a.byzantine_scale, BYZANTINE, a.byzantine_draw,
                                     BYZANTINE_DRAW)
  boundary_of = recipe.privacy.stage.boundary if recipe.privacy is not None else None
  return upload_stages.chain(
      canary=audit.make_canary_stage(n, a.canaries, a.data_seed), byzantine=byzantine,
      attack_before=byzantine is not None and boundary.before_boundary(
          boundary_of, attacks.placement(a.byzantine_attack)),
      divides_by=dp.mechanism.divides_by, server_clip=a.server_clip_l2,
      shuffle=recipe.shuffle is not None)


def _data_attack(adversary: recipes.Adversary, num_clients: int, poisoned_offset: int | None):
  """A data attack drawn each round (attacks.make_data_redraw), or None; it needs the
  store's poisoned copy (`poisoned_offset`)."""
  a = adversary
  rows = attacks.make_data_redraw(num_clients, a.byzantine_fraction, a.byzantine_attack,
                                  a.byzantine_draw, poisoned_offset or 0, BYZANTINE_DRAW)
  if rows is not None and poisoned_offset is None:
    raise ConfigError(f"config key 'byzantine_attack' = {a.byzantine_attack!r} with "
                      "byzantine_draw 'round' needs the store to hold every client's poisoned "
                      "data after the clean rows and build_simulation(poisoned_offset=) to "
                      "say where it starts (experiment/setup.py builds both)")
  return rows


# the models whose dense layers are read only by their own calls, so that their
# per-client norms and low-rank steps can come from the calls' taps (layer_taps.py)
TAPPED_MODELS = ("mlp", "cnn", "leaf_cnn")


def _one_step_width(setup: recipes.RunSetup, store: FederatedStore, conditions: dict) -> int:
  """one_step.one_step_width for this run (`conditions`: one_step.plain_sgd_why's);
  client_parallelism 'one_step' where it does not apply is a ConfigError with the
  reason."""
  width, why = one_step.one_step_width(
      epochs=setup.training.epochs, batch_size=setup.training.batch_size,
      client_count=store.client_count, **conditions)
  if setup.execution.client_parallelism == "one_step" and why:
    raise ConfigError(f"config key 'client_parallelism' = 'one_step': {why}; it needs every "
                      "client's local work to be one plain SGD step (docs: Cross-device scale)")
  return width


def _low_rank_rows(setup: recipes.RunSetup, model: Model, params_shape, store: FederatedStore,
                   conditions: dict) -> int:
  """The rows a client's steps keep (steps x batch_size) where the low_rank path
  applies (core/low_rank_steps.py), else 0; client_parallelism 'low_rank' where it
  does not is a ConfigError with the reason."""
  t = setup.training
  why = (one_step.plain_sgd_why(**conditions) or
         (f"model {setup.model!r} is not one whose dense layers are read by their calls only "
          f"({', '.join(TAPPED_MODELS)})" if setup.model not in TAPPED_MODELS else "") or
         low_rank_steps.why_not(model.apply, params_shape,
                                jax.ShapeDtypeStruct((1,) + store.x.shape[1:], store.x.dtype),
                                width=store.max_examples, epochs=t.epochs,
                                batch_size=t.batch_size,
                                cost=setup.execution.client_parallelism != "low_rank"))
  if setup.execution.client_parallelism == "low_rank" and why:
    raise ConfigError(f"config key 'client_parallelism' = 'low_rank': {why} (docs: "
                      "Cross-device scale)")
  return 0 if why else low_rank_steps.num_steps(store.max_examples, t.epochs,
                                                t.batch_size) * t.batch_size


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
                   uploads: tuple, poisoned_rows, summed_reports: bool,
                   tap_dense: bool) -> ClientStages:
  """The client phase's stages: the recipe's, with the run's upload chain
  (core/upload_stages.py) and data attack."""
  client_pipeline = recipe.client_pipeline()
  return ClientStages(
      train_one=partial(client_lib.local_train, apply_fn=model.apply, epochs=training.epochs,
                        batch_size=training.batch_size),
      objective=recipe.objective(task.loss, training.momentum), model=model,
      pipeline=client_pipeline, dp=dp, uploads=uploads, poisoned_rows=poisoned_rows,
      aggregator=None if aggregator.linear else aggregator.aggregate,
      rule_takes_ids=aggregator.takes_ids,
      rule_figures=("flagged", "clusters", *(name for name, *_ in aggregator.declares)),
      aggregate_noise=any(c.stage.owes_noise for c in recipe.upload),
      guard_nonfinite=client_pipeline is not None and (dp.client is not None
                                                      or any(c.stage.privatizes
                                                             for c in recipe.upload)),
      executor=executor, summed_reports=summed_reports, tap_dense=tap_dense)


def _summed_reports(dp: dp_round.DPRound, stacks_uploads: bool, draw: str) -> bool:
  """Whether local DP's reports' noise is drawn once for their sum: `draw`, the
  resolved local_noise_draw (recipes/flat.local_noise_draw: 'aggregate' where no
  stage reads a single report, so the sum is all that is released and its noise
  has the same distribution)."""
  if dp.report_noise is None or draw != "aggregate":
    return False
  if stacks_uploads:
    raise ConfigError("config key 'local_noise_draw' = 'aggregate': a stage of this run reads "
                      "each report (an attack, a robust rule, server clipping or audit "
                      "canaries); allowed here: auto, client")
  return True


def _round_cohort(sampler: cohort_lib.Sampler, key, r, client_count):
  """The ids and mask round r of run key `key` draws (as round_fn does; a sampler
  whose state is its init's alone, Sampler.ahead)."""
  ids, mask, _, _ = sampler.draw(
      jax.random.fold_in(jax.random.fold_in(key, r), COHORT_SAMPLING), client_count, r,
      sampler.init(jax.random.fold_in(key, SAMPLER_INIT)))
  return ids, mask
