"""make_round: one round of a run's built stages as a function of (state, store,
hyperparameters), which reads no config; build.py compiles it into scans of rounds.

  planner -> cohort sampling -> admission -> client phase (core/client_phase.py)
  -> the terms' server step -> release (central noise, the ledger) -> the terms'
  server update -> server stages -> server optimizer
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec as P

from fedjax_dp import algorithms
from fedjax_dp import recipes
from fedjax_dp import stage as stage_lib
from fedjax_dp.core.client_phase import ClientStages, client_hparams, client_phase
from fedjax_dp.core.state import COHORT_SAMPLING, DOWNLINK, RoundStats, SimState
from fedjax_dp.placement.store import FederatedStore
from fedjax_dp.privacy import dp_round
from fedjax_dp.training import server_stages as server_stages_lib
from fedjax_dp.training.server import cosine_factor


def make_round(setup: recipes.RunSetup, recipe: recipes.Recipe, mesh: Mesh,
               stages: ClientStages, dp: dp_round.DPRound, sampler) -> Callable:
  """round_fn(state, store, hp) -> (state, RoundStats): one round of the stages."""
  state_spec = stages.executor.client_state_spec
  phase = jax.shard_map(
      partial(client_phase, stages), mesh=mesh,
      in_specs=(P(), P("clients"), P("clients"), P(), P(), P(), P(), P(), state_spec, P(),
                P(), P(), P(), P()),
      out_specs=(P(), P(), state_spec, P(), P()))
  objective = stages.objective
  population, training = setup.population, setup.training
  server_stages = recipe.server_stages(population.num_clients, DOWNLINK)
  mechanism = dp.mechanism
  round_client_hp = partial(client_hparams, schedule=training.lr_schedule,
                            rounds=training.rounds, momentum=training.momentum > 0,
                            mechanism_keys=mechanism.client_hparams)
  server_optimizer = recipe.server_optimizer_fn
  num_clients, expected_cohort = population.num_clients, population.clients_per_round
  # a mechanism that releases every round (central DP) applies a round nobody took
  # part in (its noise was released and accounted); otherwise such a round (empty
  # Poisson draw, all spent) applies nothing
  keep_if = ((lambda adm, stats: adm.skip) if mechanism.releases_every_round
             else (lambda adm, stats: stats.participants == 0))
  server_context = lambda adm, stats: algorithms.ServerContext(
      num_clients=num_clients,
      cohort_size=(expected_cohort if mechanism.divides_by == "expected_cohort"
                   else stats.participants),
      applied=~keep_if(adm, stats))

  def round_fn(state: SimState, store: FederatedStore, hp: dict) -> tuple[SimState, RoundStats]:
    """planner -> sampling -> admission -> clients -> aggregate -> server stages ->
    server optimizer; the ledger composes what the round applied."""
    round_key = jax.random.fold_in(state.key, state.round)
    plan = dp.plan(state, hp)
    ids, mask, overflow, sampler_state = sampler.draw(
        jax.random.fold_in(round_key, COHORT_SAMPLING), store.client_count, state.round,
        state.sampler)
    adm = dp.admit(state, ids, mask, plan, hp)
    clip_norm = dp.clip_norm(state, hp)
    delta, stats, client_state, contrib_sum, agg_slots = phase(
        state.params, ids, adm.mask, round_client_hp(hp, state.round), round_key, clip_norm,
        plan.scales, adm.factor, state.client_state, state.server_state, store.x, store.y,
        store.client_index, store.client_count)
    server_state = {**objective.server_step(state.server_state, contrib_sum, num_clients,
                                            hp=hp["terms"]), **agg_slots}
    delta, privacy, event = dp.release(delta, state, plan, adm, ids, stats.participants,
                                       stats.unclipped, round_key, clip_norm, hp)
    stats = stats._replace(spent=adm.spent, event=event)
    # the local terms' change to the released update (FedDyn's -h / alpha; none for
    # the others): post-processing of the release
    delta, server_state = objective.server_update(delta, server_state,
                                                  server_context(adm, stats), hp=hp["terms"])
    ctx = server_stages_lib.RoundContext(round_key, hp, ids, adm.mask, stats.participants,
                                         adm.skip, ~keep_if(adm, stats))
    delta, server_state, server_metrics = server_stages.update(delta, server_state, ctx)
    stats = stats._replace(metrics=stage_lib.merge_metrics(stats.metrics, server_metrics))
    server_lr = hp["server_lr"] if training.server_lr_schedule == "constant" else (
        hp["server_lr"] * cosine_factor(state.round, training.rounds, hp["server_lr_alpha"], jnp))
    params, opt_state = _server_step(server_optimizer(server_lr, hp.get("server_momentum")),
                                     delta, state.params, state.server_opt_state,
                                     frozen=objective.solo, keep=keep_if(adm, stats))
    return state._replace(round=state.round + 1, params=params, server_opt_state=opt_state,
                          participations=state.participations + stats.participants,
                          cohort_overflow=state.cohort_overflow + overflow, privacy=privacy,
                          client_state=client_state, sampler=sampler_state,
                          server_state=server_state), stats
  return round_fn


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
