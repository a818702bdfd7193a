"""A privacy mechanism as one bundle: its static properties and the round's functions.

Each mechanism is one module of this package (no_privacy, central_gaussian,
local_gaussian) that builds a `Mechanism`; `privacy/mechanisms/__init__.py`
registers them by the config's `dp` name. The round (core/round.py,
core/client_phase.py) and the recipes' checks read only the bundle's
properties and call its functions, never its name, so a new mechanism is one
new module plus one registry line (README: Extending).

The round calls, each with the static set-up (`RoundSetup`) bound first:

  plan(setup, state, hp) -> Plan
      this round's noise scales per clip part and the RDP the accountant will
      charge for it (one round, or one participation)
  admit(setup, state, ids, mask, plan, hp) -> Admission
      who takes part (budgets), whether the round runs, per-client noise factors
  client(setup, upload, cid, key, clip_norm, client_hp, scales, factor) -> (upload, norm)
      the client half, per upload: clip (and noise) one upload; its norm before
      the clip (not finite where it was sent as zero). None: no client half.
  release(setup, delta, state, plan, adm, ids, participants, unclipped, key,
          clip_norm, hp) -> (delta, slot, event)
      the server half: noise on the aggregate and the mechanism's new state slot
      (the ledger composed with what was applied, the clip norm's next value),
      the privacy log's event
      (RoundStats.event: an index into Privacy.event_multipliers, 0 one local
      participation at static noise, -2 at scheduled noise, -1 nothing released)

and at set-up `event_rdp(z, cohort) -> [orders]`: the RDP of one round (or
participation) at accounted noise multiplier z, for the accountant and the
calibration to target_epsilon. The mechanism owns its slot of the round state,
SimState.privacy (PrivacyState: the ledger and the clip norm, or its own type
with those first), made by `init_state` and replaced by `release`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy import clip_layout
from fedjax_dp.privacy import noise_control

SCORE_GRID = 17   # controller outputs at which central DP's adaptive-noise RDP is tabulated
DIVIDES_BY = ("examples", "participants", "expected_cohort")


class CohortSampling(NamedTuple):
  """How a round's cohort is drawn, as the accountant sees it."""
  sampling: str            # placement/participation.SAMPLINGS
  clients_per_round: int
  num_clients: int
  participation: Any = None   # the sampler's schema (placement/participation.Participation)


class RoundSetup(NamedTuple):
  """The static set-up the round's mechanism functions read (fixed when the round is built)."""
  privacy: Any             # privacy/setup.Privacy
  num_clients: int
  expected_cohort: int     # central DP's fixed denominator (clients_per_round)
  client_noise: Any        # the rule's (its state) -> [num_clients] noise factors
                           # (per-cluster noise: robust/cluster.py), or None
  noise_tag: int           # fold_in tags of the round key: the noise on the sum,
  count_tag: int           # adaptive clipping's count noise,
  local_noise_tag: int     # each client's own noise


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


class PrivacyState(NamedTuple):
  """A mechanism's slot of the round state (SimState.privacy): what the built-in
  mechanisms keep. A mechanism with more state (a correlated-noise buffer) keeps
  its own NamedTuple whose first fields are these two."""
  ledger: jax.Array      # float32 RDP spent: [orders] (zeros without DP), or
                         # [num_clients, orders] with per-client ledgers
  clip_norm: jax.Array   # float32: the clip norm of the next round (moves if adaptive)


class Mechanism(NamedTuple):
  """A privacy mechanism: the round's functions (module docstring) and the static
  properties the recipes' checks and the round read."""
  name: str
  plan: Callable
  admit: Callable
  release: Callable
  client: Callable | None = None    # the client half (None: the uploads go as they are)
  report_noise: Callable | None = None  # (setup, tree, clip_norm, client_hp, scales) -> each
                                        # leaf's std of the noise the client half adds to a
                                        # report after its clip (None: it only clips)
  event_rdp: Callable | None = None  # (z, CohortSampling) -> np [orders]
  private: bool = True              # releases under a DP guarantee (False: no privacy)
  noises_sum: bool = False          # noise on the sum of clipped updates (needs a linear
                                    # aggregate; the clipped-count query of adaptive clipping)
  noises_each_upload: bool = False  # each client noises its whole clipped upload: the guarantee
                                    # is a dense vector's; the noise can be set per client
  per_client_ledgers: bool = False  # each client accounts its own epsilon (per-client budgets)
  calibrates_to_target: bool = False  # can set its noise from target_epsilon
  clips_after_pipeline: bool = True   # its clip follows the upload pipeline's stages
  boundary: str | None = "server"   # where its clip and noise sit (privacy/boundary.py):
                                    # 'server' clips what arrives; 'client' before it leaves
  divides_by: str = "participants"  # the aggregate's denominator: 'examples' (FedAvg's
                                    # n_i / n), 'participants' (uniform mean), 'expected_cohort'
                                    # (release divides the plain sum by clients_per_round)
  releases_every_round: bool = False  # a round nobody took part in is still released (its
                                      # noise) and applied
  client_hparams: tuple = ()        # the round's hyperparameters the client half reads
  scales_client_noise: bool = False  # its client half multiplies each client's noise by the
                                     # admission's factor and its admission charges each
                                     # client for that noise (a rule's client_noise needs it)
  accountants: tuple = ("rdp",)     # the config's accountants that can compose its events
  check: Callable | None = None     # (settings: {config key: value}) -> why this mechanism
                                    # cannot run them, in one line, or None
  describe: Callable | None = None  # (CohortSampling) -> the report's "mechanism",
                                    # "guarantee" and "neighbouring" lines
  init_state: Callable | None = None  # (num_clients, clip_norm, params, privacy) -> its state
                                      # slot (None: initial_state's PrivacyState)
  recipe_prefix: str = ""           # of the recipe's name (dp_fedavg, ldp_fedavg)
  strategy_for: Callable | None = None  # (settings, participation.Participation, rounds) ->
                                        # its correlated-noise Strategy, built at set-up
                                        # (privacy/mechanisms/correlated.py); None: no strategy
  charged_once: bool = False        # event_rdp is the whole run's, which the rounds charge in
                                    # shares (a calibration composes it once, not per round)
  needs_random_cohorts: bool = False  # its accounting amplifies by random cohorts (poisson,
                                      # fixed): a scheduled participation (cyclic) is refused
  reads: tuple = ()                 # the config keys of its own (read only under it)
  releases: tuple = ()              # ((summary.json path, status, says), ...): what its report
                                    # lines publish that is not the accountant's figures
                                    # (privacy.** is covered otherwise; statuses of
                                    # fedjax_dp/stage.py), looked up first for its runs


def initial_state(mechanism: Mechanism | None, num_clients: int, clip_norm: float,
                  params=None, privacy=None):
  """Round 0's slot of `mechanism` (None: no privacy): its own init_state (given the
  model's parameters and the run's privacy/setup.Privacy), else an empty ledger (one
  per client with per_client_ledgers) and the configured clip norm."""
  from fedjax_dp.privacy import accounting
  if mechanism is not None and mechanism.init_state is not None:
    return mechanism.init_state(num_clients, clip_norm, params, privacy)
  shape = (num_clients,) if mechanism is not None and mechanism.per_client_ledgers else ()
  return PrivacyState(accounting.init_ledger(shape=shape), jnp.float32(clip_norm))


def static_plan(setup: RoundSetup, state, hp) -> Plan:
  """No noise to plan: scale 1, the static event."""
  return Plan(jnp.ones((1,), jnp.float32), hp.get("event_rdp"), jnp.int32(0))


def planned_scales(setup: RoundSetup, state, hp) -> jax.Array:
  """This round's noise scales per part, set by the noise controller from earlier
  released updates ([parts] float32)."""
  score = state.server_state["noise_control"]["score"]
  return noise_control.noise_scales(setup.privacy.schedule, score, hp["tier_scales"],
                                    hp.get("convergence_beta"))


def everyone(setup: RoundSetup, state, ids, mask, plan: Plan, hp) -> Admission:
  """Every drawn client takes part, at noise factor 1."""
  none = jnp.zeros((), jnp.int32)
  return Admission(mask, jnp.zeros((), bool), none,
                   jnp.ones((setup.num_clients,), jnp.float32), plan.event)


def round_clip_norm(setup: RoundSetup, state, hp):
  """Adaptive clipping moves the norm in the state; else it is a hyperparameter."""
  return state.privacy.clip_norm if setup.privacy.adaptive else hp["clip_norm"]


def clip(setup: RoundSetup, delta, clip_norm):
  """One upload clipped by the layout: (upload, its norm before the clip)."""
  return clip_layout.clip_update(delta, clip_norm, setup.privacy.layout)


def poisson_rate_used(q: float) -> float:
  """P(u < float32(q)) for jax.random.bernoulli's u, uniform on the grid j / 2^23
  (float32 mantissa bits), j = 0 .. 2^23 - 1: ceil(float32(q) 2^23) / 2^23, exact
  in float64. It differs from q by at most 2^-23 (e.g. 0.1 -> 0.10000002384): the
  rate Poisson sampling really draws with, which the accountant charges."""
  return min(1.0, math.ceil(float(np.float32(q)) * 2.0 ** 23) / 2.0 ** 23)
