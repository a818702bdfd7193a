"""A DP mechanism's part of the compiled round, bound to the run's set-up.

`make_dp_round(privacy, ...)` looks up the mechanism the resolved set-up
(privacy/setup.Privacy) names (privacy/mechanisms/) and binds its functions to
the static set-up, so the round calls them as

  plan(state, hp)       -> Plan: this round's noise scales per part and the RDP the
                           accountant will charge for it
  clip_norm(state, hp)  -> this round's clip norm (the state's under adaptive clipping)
  client(upload, id, key, clip_norm, client_hp, scales, factor)
                        -> (upload, norm): the mechanism's client half in the client
                           phase (None: it has none)
  admit(state, ids, mask, plan, hp)
                        -> Admission: who takes part, whether the round runs
  release(delta, state, plan, adm, ids, participants, unclipped, key, clip_norm, hp)
                        -> (delta, the mechanism's new state slot, event)

Each mechanism's module says what its functions do (privacy/mechanisms/base.py).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy.mechanisms import base


class AdaptiveClipping(NamedTuple):
  """Adaptive clipping (Andrew et al. 2021) as a recipe names it."""
  name: str = "adaptive_clipping"
  needs_noised_sum: bool = True        # its clipped-count query is noised on the cohort's sum
  excludes_varying_noise: bool = True  # the count noise is fitted to one static multiplier


ADAPTIVE_CLIPPING = AdaptiveClipping()


class DPRound(NamedTuple):
  plan: Callable
  admit: Callable
  release: Callable
  clip_norm: Callable      # (state, hp) -> this round's clip norm
  client: Callable | None  # the client half, per upload (None: the mechanism has none)
  mechanism: base.Mechanism    # its static properties, which the executor and the round read
  refuses_clients: bool = False  # admission may refuse a drawn client or skip the round
  clip: Callable | None = None   # (upload, clip_norm) -> (clipped, norm): the client half's clip
  report_noise: Callable | None = None  # (tree, clip_norm, client_hp, scales) -> per-leaf std
                                        # of a report's noise (local DP), else None
  layout: object = None          # the clip layout (privacy/clip_layout.ClipLayout)


def make_dp_round(privacy, num_clients: int, expected_cohort: int, client_noise,
                  noise_tag: int, count_tag: int, local_noise_tag: int) -> DPRound:
  """The round's DP functions for `privacy` (privacy/setup.Privacy; mode none too).
  client_noise: the rule's (state) -> per-client noise factors, or None."""
  setup = base.RoundSetup(privacy, num_clients, expected_cohort, client_noise, noise_tag,
                          count_tag, local_noise_tag)
  m = mechanisms.get_mechanism(privacy.mode)
  bind = lambda f: None if f is None else functools.partial(f, setup)
  return DPRound(bind(m.plan), bind(m.admit), bind(m.release), bind(base.round_clip_norm),
                 bind(m.client), m,
                 refuses_clients=privacy.stop_in_round or (
                     m.per_client_ledgers and privacy.target_epsilon is not None),
                 clip=bind(base.clip), report_noise=bind(m.report_noise),
                 layout=getattr(privacy, "layout", None))
