"""The privacy report's section for correlated noise (tree, BandMF, BLT;
privacy/mechanisms/correlated.py): the strategy, the participation the sampler
enforced, the sensitivity and noise it sets, and how the ledger charged the one
Gaussian mechanism the run is."""

from __future__ import annotations

import math

import numpy as np


def correlated_section(cfg, sim, rounds: int) -> dict:
  """summary.json privacy.correlated_noise."""
  strategy, schedule = sim.privacy.strategy, sim.privacy.participation
  z = sim.privacy.update_noise_multiplier   # the noise applied (adaptive clipping: above z)
  sens = math.sqrt(strategy.sensitivity2)
  errors = ({} if strategy.round_rms is None else {
      "round_noise_rms": z * sens * strategy.round_rms * cfg.clip_norm,
      "prefix_sum_error_rms": z * sens * strategy.prefix_rms * cfg.clip_norm,
      "errors_are": "expected over the noise, before dividing by clients_per_round: a "
                    "round's noise on the sum (root mean square over rounds and per "
                    "coordinate), and the error of the noisy prefix sums the model follows"})
  return {"strategy": strategy.says,
          "participation": {"sampling": schedule.sampling, "min_sep": schedule.min_sep,
                            "max_participations": schedule.max_participations,
                            **({} if schedule.sampling_prob is None else
                               {"sampling_prob": schedule.sampling_prob}),
                            "from": "the cohort sampler's schedule "
                                    "(placement/participation.py), not a key of its own"},
          "sensitivity": sens,
          "noise_std": z * sens * cfg.clip_norm,
          "noise_std_is": ("the std of the strategy's noise rows Z: z sensitivity clip_norm; "
                           "round t adds (C^-1 Z)_t to the clipped sum" + (
                               "; with adaptive clipping z is the updates' multiplier "
                               "(update_noise_multiplier) and these figures are at the initial "
                               "clip_norm: round t's scale with its own clip norm"
                               if cfg.adaptive_clipping else "")),
          **errors,
          "charged_share": float(np.sum(strategy.charges[:rounds])),
          "accounting": _accounting(strategy, schedule)}


def _accounting(strategy, schedule) -> str:
  if strategy.sampled is not None:
    return (f"amplified (Choquette-Choo et al. 2023; jax-privacy's amplified_bandmf_event): "
            f"each of a client's {schedule.max_participations} participations, one column of "
            "the strategy (sensitivity 1, in the noise), is a Poisson-subsampled Gaussian of "
            f"multiplier z at rate q = {strategy.sampled:.8g} (the rate the sampler draws "
            "with); the ledger charges one as each cycle of min_sep rounds starts")
  return ("the whole run is one Gaussian mechanism of multiplier z on a query of sensitivity "
          "1 (the strategy's sensitivity is in the noise); the ledger charges it in shares as "
          "the released rounds' sensitivity grows (charged_share of it so far, 1 after the "
          "last round)")


def correlated_pld(cfg, sim, rounds: int) -> float:
  """dp-accounting's PLD epsilon of what the ledger holds after `rounds` rounds (one
  Gaussian, or amplified the cycles' subsampled Gaussians;
  privacy/mechanisms/correlated.charged_steps)."""
  from fedjax_dp.privacy.mechanisms.correlated import charged_steps
  from fedjax_dp.privacy.planning import pld_epsilon
  return pld_epsilon(*charged_steps(sim.privacy.accounted_noise_multiplier,
                                    sim.privacy.strategy, rounds), cfg.delta)


def count_note(sim) -> str:
  """How adaptive clipping's count query is accounted beside correlated noise
  (privacy/mechanisms/correlated.count_queries)."""
  from fedjax_dp.privacy.mechanisms.correlated import count_queries
  strategy = sim.privacy.strategy
  k = count_queries(strategy, sim.privacy.participation)
  per = ("with each participation's column in its subsampled Gaussian" if strategy.sampled
         else f"{k} of them, one per participation, with the strategy's Gaussian")
  return ("the noised clipped-count query is accounted: the count's (count_stddev, sensitivity "
          f"1/2: zero-out neighbours zero a client's centred bit too) composes, {per}, so that "
          "with the updates' noise "
          "(update_noise_multiplier) it is one Gaussian of accounted_noise_multiplier; the "
          "ledger's shares also cover the participations begun")
