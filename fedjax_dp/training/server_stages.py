"""Server stages: what the server does to the aggregate before its optimizer.

A stage is optax's (init, update) pair over the round's aggregate update, plus
the round's context, on the round's one stage protocol (fedjax_dp/stage.py), and
owns one named slot of `SimState.server_state`:

    init(params, d)                 -> state of its slot
    update(delta, state, ctx)       -> (delta, state, metrics)

`delta` is the aggregate model delta (a params pytree; the server optimizer
takes -delta as its gradient); metrics go to RoundStats.metrics[its name]. `chain`
runs stages in order, each on its own slot (stage.named_chain_update, as optax's
named_chain: the slots are a dict by name, so a checkpoint's server_state reads
the same whichever stages ran before).

  downlink_topk(s, kernel)   the server sends only the top (1 - s) coordinates
                             of the update; what it does not send is kept and
                             added next round (error feedback)    slot downlink_residual
  public_update()            records the released update, for public_topk's
                             index selection next round            slot public_update
  noise_controller(...)      the dynamic-DP paper's controller: observes the
                             released update, keeps the paper's per-round
                             charge beside the accountant's          slot noise_control
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp import stage as stage_lib
from fedjax_dp.privacy import noise_control
from fedjax_dp.compression import pipeline as pipeline_lib


class RoundContext(NamedTuple):
  """What a server stage may read of the round (all traced)."""
  key: jax.Array           # the round's key; a stage folds in its own tag
  hp: dict                 # hyperparameters (hparams.py)
  ids: jax.Array           # [slots] int32 cohort client ids
  mask: jax.Array          # [slots] bool: took part
  participants: jax.Array  # int32
  skipped: jax.Array       # bool: the round was not run (central DP budget)
  applied: jax.Array       # bool: the server applies this round's update (someone took
                           # part, or central DP released its noise, and it was not skipped)


class ServerStage(NamedTuple):
  name: str                 # its slot in server_state
  init: Callable            # (params, d) -> state
  update: Callable          # (delta, state, ctx) -> (delta, state, metrics)
  declares: tuple = ()      # its metrics' release declarations, ((name, status, says), ...)
                            # (fedjax_dp/stage.py)


def chain(*stages: ServerStage) -> ServerStage:
  """The stages in order, each reading and writing its own slot of the server
  state dict (slots the chain does not own pass through)."""
  def init(params, d):
    return {s.name: s.init(params, d) for s in stages}
  return ServerStage("chain", init, stage_lib.named_chain_update(stages))


def downlink_topk(sparsity: float, key_tag: int, kernel: str) -> ServerStage:
  def update(delta, residual, ctx):
    flat, unravel = ravel_pytree(delta)
    sent, _, new_residual = pipeline_lib.downlink_topk(
        flat, residual, sparsity, jax.random.fold_in(ctx.key, key_tag), kernel)
    # a round the server does not apply sends nothing: the residual keeps what it owes
    return unravel(sent), jnp.where(ctx.applied, new_residual, residual), {}
  return ServerStage("downlink_residual", lambda params, d: jnp.zeros((d,), jnp.float32),
                     update)


def public_update() -> ServerStage:
  def update(delta, previous, ctx):
    # a round the server does not apply published nothing new: keep the last update
    return delta, jnp.where(ctx.applied, ravel_pytree(delta)[0], previous), {}
  return ServerStage("public_update", lambda params, d: jnp.zeros((d,), jnp.float32), update)


def noise_controller(schedule: str, measure: str, window: int, num_clients: int) -> ServerStage:
  """Observes the released update (a static schedule never reads the controller)
  and adds the paper's per-round charge for the round's participants."""
  def update(delta, nc, ctx: RoundContext):
    hp = ctx.hp
    z_round = hp["update_noise"] * noise_control.base_factor(schedule, nc["score"],
                                                             hp.get("convergence_beta"))
    paper_eps = hp["paper_epsilon_scale"] / z_round   # +inf without noise
    scatter = jnp.where(ctx.mask, ctx.ids, num_clients)
    observed = nc
    if schedule != "static":
      observed = noise_control.observe(nc, ravel_pytree(delta)[0], hp["convergence_lambda"],
                                       hp["noise_ema"], measure, hp["noise_ema_rest"])
    # a round nobody took part in released nothing: the controller sees nothing
    observed = jax.tree.map(lambda new, old: jnp.where((ctx.participants == 0) | ctx.skipped,
                                                       old, new), observed, nc)
    observed["paper_epsilon"] = nc["paper_epsilon"].at[scatter].add(paper_eps, mode="drop")
    observed["participations"] = nc["participations"].at[scatter].add(1, mode="drop")
    observed["skipped"] = nc["skipped"] + ctx.skipped.astype(jnp.int32)
    observed["paper_epsilon_rounds"] = nc["paper_epsilon_rounds"] + jnp.where(ctx.skipped, 0.0,
                                                                              paper_eps)
    return delta, observed, {}
  return ServerStage("noise_control",
                     lambda params, d: noise_control.init_state(d, window, num_clients), update)


class ServerStageSpec(NamedTuple):
  """A server stage as a recipe names it, before the run's sizes are known, with
  the static properties recipes check a combination by."""
  name: str
  build: Callable[[int, int], ServerStage]   # (num_clients, key_tag) -> the stage
  needs_sparsifier: bool = False     # serves a client top-k stage (public_topk's indices)


def downlink_topk_spec(sparsity: float, kernel: str) -> ServerStageSpec:
  return ServerStageSpec("downlink_topk", lambda n, tag: downlink_topk(sparsity, tag, kernel))


def public_update_spec() -> ServerStageSpec:
  return ServerStageSpec("public_update", lambda n, tag: public_update(), needs_sparsifier=True)
