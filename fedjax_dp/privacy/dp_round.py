"""A DP mechanism's part of the compiled round: planner, admission, release.

`make_dp_round(privacy, ...)` turns the resolved set-up (privacy/setup.Privacy) into
three functions the round calls in order; the mechanism's client half (clip,
local noise) runs in the client phase, its report is privacy_report.py.

  plan(state, hp)       -> Plan: this round's noise scales per part (the noise
                           controller's schedule) and the RDP the accountant will
                           charge for it (one round, or one participation)
  clip_norm(state, hp)  -> this round's clip norm (the state's under adaptive clipping)
  client(upload, id, key, clip_norm, client_hp, scales, factor)
                        -> (upload, norm): the client half in the client phase:
                           clip one upload (and, local DP, noise it from its
                           client's key)
  admit(state, ids, mask, plan, hp)
                        -> Admission: central DP skips a round that would pass
                           target_epsilon; local DP refuses each client whose own
                           ledger would pass its budget; per-cluster noise factors
  release(delta, state, plan, adm, participants, unclipped, key, clip_norm, hp)
                        -> (delta, ledger, clip_norm, event): central DP adds the
                           Gaussian noise to the sum and divides by the expected
                           cohort; the ledger composes what was applied; adaptive
                           clipping moves the clip norm; `event` is what the host's
                           privacy log records (RoundStats.event)

Without DP all three are identities (event -1: nothing released under DP).

Each is a module-level function whose first argument is the static set-up
(DPRoundSetup); make_dp_round binds it, so the round calls them as above.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy import noise_control
from fedjax_dp.kernels import gaussian_noise

SCORE_GRID = 17   # controller outputs at which central DP's adaptive-noise RDP is tabulated


class Mechanism(NamedTuple):
  """A DP mechanism as a recipe names it, with the static properties recipes
  check a combination by (its numbers and clip layout: simulation.Privacy)."""
  name: str
  noises_sum: bool = False          # noise on the sum of clipped updates (needs a linear
                                    # aggregate; the clipped-count query of adaptive clipping)
  noises_each_upload: bool = False  # each client noises its whole clipped upload: the guarantee
                                    # is a dense vector's; the noise can be set per client
  per_client_ledgers: bool = False  # each client accounts its own epsilon (per-client budgets)
  calibrates_to_target: bool = False  # can set its noise from target_epsilon
  clips_after_pipeline: bool = True   # its clip follows the upload pipeline's stages
  boundary: str = "server"          # where its clip and noise sit (privacy/boundary.py):
                                    # 'server' clips what arrives; 'client' before it leaves


MECHANISMS = {
    "central": Mechanism("central", noises_sum=True, calibrates_to_target=True,
                         boundary="server"),
    "local": Mechanism("local", noises_each_upload=True, per_client_ledgers=True,
                       boundary="client"),
}


class AdaptiveClipping(NamedTuple):
  """Adaptive clipping (Andrew et al. 2021) as a recipe names it."""
  name: str = "adaptive_clipping"
  needs_noised_sum: bool = True        # its clipped-count query is noised on the cohort's sum
  excludes_varying_noise: bool = True  # the count noise is fitted to one static multiplier


ADAPTIVE_CLIPPING = AdaptiveClipping()


class Plan(NamedTuple):
  scales: jax.Array        # [parts] float32 noise std per part / (z C)
  event: jax.Array | None  # [orders] float32 RDP of the round (central) or participation (local)
  event_index: jax.Array   # int32 into Privacy.event_multipliers


class Admission(NamedTuple):
  mask: jax.Array          # [slots] bool: admitted participants
  skip: jax.Array          # bool: the round is not run (central DP budget)
  spent: jax.Array         # int32 draws refused for a spent budget (skip counts 1)
  factor: jax.Array        # [num_clients] float32 per-client noise factor (per-cluster noise)
  client_event: jax.Array | None   # RDP of one participation: [orders] or [slots, orders]


class DPRound(NamedTuple):
  plan: Callable
  admit: Callable
  release: Callable
  clip_norm: Callable      # (state, hp) -> this round's clip norm
  client: Callable         # the client half, per upload: clip (and local noise), in the
                           # client phase
  # static properties the executor and the round read
  mode: str = "none"       # none | central | local
  per_upload: bool = False       # the round has a client half (each upload on its own)
  refuses_clients: bool = False  # admission may refuse a drawn client or skip the round


class DPRoundSetup(NamedTuple):
  """The static set-up the round's DP functions read (fixed when the round is built)."""
  privacy: Any             # privacy/setup.Privacy (mode none too)
  num_clients: int
  expected_cohort: int     # central DP's fixed denominator (clients_per_round)
  cluster_noise: bool      # per-cluster noise factors (cluster_noise 'equalize')
  noise_tag: int           # fold_in tags of the round key: central DP's noise,
  count_tag: int           # adaptive clipping's count noise,
  local_noise_tag: int     # local DP's per-client noise


def make_dp_round(privacy, num_clients: int, expected_cohort: int, cluster_noise: bool,
                  noise_tag: int, count_tag: int, local_noise_tag: int) -> DPRound:
  """The round's DP functions for `privacy` (privacy/setup.Privacy; mode none too)."""
  setup = DPRoundSetup(privacy, num_clients, expected_cohort, cluster_noise, noise_tag,
                       count_tag, local_noise_tag)
  mode = privacy.mode
  bind = lambda f: functools.partial(f, setup)   # the round calls them without the set-up
  return DPRound(bind(plan_round), bind(admit_clients), bind(release_update),
                 bind(round_clip_norm), bind(clip_and_noise_upload), mode=mode,
                 per_upload=mode != "none",
                 refuses_clients=privacy.stop_in_round or (
                     mode == "local" and privacy.target_epsilon is not None))


def plan_round(setup: DPRoundSetup, state, hp) -> Plan:
  """This round's noise scales per part and the RDP the accountant will charge."""
  privacy, mode = setup.privacy, setup.privacy.mode
  scales, event, index = jnp.ones((1,), jnp.float32), hp.get("event_rdp"), jnp.int32(0)
  if mode == "none":
    return Plan(scales, event, index)
  # this round's noise, set by the controller from earlier released updates
  score = state.server_state["noise_control"]["score"]
  scales = noise_control.noise_scales(privacy.schedule, score, hp["tier_scales"],
                                      hp.get("convergence_beta"))
  if privacy.schedule != "static" and mode == "local":
    event = noise_control.local_event_rdp(hp["update_noise"], privacy.layout.fractions, scales)
  elif privacy.schedule != "static":
    # tabulated at grid scores; noise falls as the score grows, so rounding the
    # score up charges at most the noise actually used
    k = jnp.ceil(score * (SCORE_GRID - 1) - 1e-6).astype(jnp.int32)
    index = jnp.clip(k, 0, SCORE_GRID - 1)
    event = hp["event_table"][index] * (1.0 + 1e-6)
  return Plan(scales, event, index)


def admit_clients(setup: DPRoundSetup, state, ids, mask, plan: Plan, hp) -> Admission:
  """Who takes part: the round's skip (central budget), each client's own budget
  (local DP), and the per-cluster noise factors."""
  privacy, mode = setup.privacy, setup.privacy.mode
  skip, spent = jnp.zeros((), bool), jnp.zeros((), jnp.int32)
  if privacy.stop_in_round:
    # central DP: a round that would pass the target is not run (nothing released)
    skip = accounting.epsilon(accounting.compose(state.ledger, plan.event),
                              hp["delta"])[0] > hp["budget_limit"]
    mask = mask & ~skip
  factor = jnp.ones((setup.num_clients,), jnp.float32)
  client_event = plan.event
  if setup.cluster_noise:
    cn = state.server_state["cluster_noise"]
    factor = noise_control.cluster_noise_factors(cn["size"], cn["median"])
    # RDP of a Gaussian goes as 1 / z^2; nudged up past the float32 rounding
    client_event = (plan.event[None, :] / jnp.square(factor[ids])[:, None]) * (1.0 + 1e-6)
  if mode == "local" and privacy.target_epsilon is not None:
    # a client takes part only if its own ledger stays within its budget after it
    after = accounting.compose(state.ledger[ids], client_event)
    within = accounting.epsilon(after, hp["delta"])[0] <= hp["client_budget_limits"][ids]
    spent = jnp.sum(mask & ~within, dtype=jnp.int32)
    mask = mask & within
  return Admission(mask, skip, spent + skip.astype(jnp.int32), factor, client_event)


def release_update(setup: DPRoundSetup, delta, state, plan: Plan, adm: Admission, ids,
                   participants, unclipped, key, clip_norm, hp):
  """(delta, ledger, clip_norm, event): central DP's noise on the sum, the ledger
  composed with what was applied, adaptive clipping's new norm, the log's event."""
  privacy, mode, expected_cohort = setup.privacy, setup.privacy.mode, setup.expected_cohort
  ledger = state.ledger
  if mode == "central":
    # DP-FedAvg (McMahan et al. 2018): N(0, (z C)^2) on the sum of clipped
    # updates, divided by the expected cohort size q N = clients_per_round
    # (a fixed denominator: the realised size is itself private).
    std = hp["update_noise"] * clip_norm
    delta = jax.tree.map(
        lambda d: d / expected_cohort,
        gaussian_noise.add_gaussian_noise(delta, jax.random.fold_in(key, setup.noise_tag),
                                          mechanisms.noise_std_per_leaf(privacy.layout, std,
                                                                        delta, plan.scales)))
    ledger = jnp.where(adm.skip, ledger, accounting.compose(ledger, plan.event))
    if privacy.adaptive:
      clip_norm = mechanisms.adaptive_clip_norm(
          clip_norm, unclipped - 0.5 * participants, jax.random.fold_in(key, setup.count_tag),
          expected_cohort, hp["target_quantile"], hp["clip_lr"], hp["count_stddev"])
    # the noise is released even when nobody took part
    event = jnp.where(adm.skip, -1, plan.event_index)
  elif mode == "local":
    # only real slots write: padded slots carry client id 0, and a second write to
    # client 0's row (its old ledger) could win over its update (found with 4 devices)
    ledger = ledger.at[jnp.where(adm.mask, ids, setup.num_clients)].set(
        accounting.compose(ledger[ids], adm.client_event, adm.mask), mode="drop")
    event = jnp.where(participants > 0, 0 if privacy.schedule == "static" else -2, -1)
  else:
    event = jnp.int32(-1)
  return delta, ledger, clip_norm, jnp.asarray(event, jnp.int32)


def round_clip_norm(setup: DPRoundSetup, state, hp):
  # adaptive clipping moves the norm in the state; else it is a hyperparameter
  return state.clip_norm if setup.privacy.adaptive else hp["clip_norm"]


def clip_and_noise_upload(setup: DPRoundSetup, delta, cid, key, clip_norm, client_hp, scales,
                          factor):
  """One client's upload clipped to clip_norm by the layout and, under local DP,
  noised from its own stream fold_in(fold_in(key, tag), cid), its std times
  `factor` (per-cluster noise, else 1). Returns (upload, its norm before the clip:
  not finite where the upload was sent as zero). Per upload, so the client loop
  runs it inside its weighted sum (client_phase.py) or vmapped over a stack."""
  layout = setup.privacy.layout
  delta, norm = mechanisms.clip_update(delta, clip_norm, layout)
  if setup.privacy.mode == "local":
    delta = mechanisms.add_one_client_noise(
        delta, cid, jax.random.fold_in(key, setup.local_noise_tag),
        client_hp["update_noise"] * clip_norm, layout, scales, factor)
  return delta, norm
