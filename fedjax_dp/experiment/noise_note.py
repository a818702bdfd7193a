"""What a run's DP noise does to the mean update, said before the first round: the noise
multiplier (and where it came from), its std on the mean update over the clip norm,
and a warning where that noise is larger than the clip itself (first-hour review,
finding 1: a calibrated multiplier of 62.7 wrecked the model silently)."""

from __future__ import annotations

import math

from fedjax_dp.privacy.mechanisms import get_mechanism

SWAMPED = 1.0   # noise std on the mean update over the clip norm above which it swamps it


def mean_update_ratio(cfg, noise_multiplier: float | None, strategy=None) -> float | None:
  """The noise's std on the mean update, per coordinate, over clip_norm: z / m where the
  server noises the sum of m clipped uploads, z / sqrt(m) where each of the m clients
  noises its own (m = clients_per_round); None without such noise. A correlated-noise
  `strategy` (privacy/mechanisms/correlated.py) scales the server's by its sensitivity
  and its rounds' RMS noise factor."""
  m = get_mechanism(cfg.dp)
  if not m.private or not noise_multiplier:
    return None
  if strategy is not None:
    return (noise_multiplier * math.sqrt(strategy.sensitivity2) * (strategy.round_rms or 1.0)
            / cfg.clients_per_round)
  if m.noises_sum:
    return noise_multiplier / cfg.clients_per_round
  if m.noises_each_upload:
    return noise_multiplier / math.sqrt(cfg.clients_per_round)
  return None


def reported_ratio(cfg, privacy: dict) -> float | None:
  """mean_update_ratio from a run's privacy report (summary.json), where the
  simulation is gone: correlated noise's from its section's round_noise_rms (the
  same figure, z sens clip_norm times the rounds' RMS factor), else from the
  noise multiplier."""
  rms = (privacy.get("correlated_noise") or {}).get("round_noise_rms")
  if rms is not None:
    return rms / (cfg.clip_norm * cfg.clients_per_round)
  return mean_update_ratio(cfg, privacy.get("noise_multiplier"))


def lines(cfg, noise_multiplier: float | None, calibrated: bool, strategy=None,
          update_noise: float | None = None, count_stddev: float = 0.0) -> list[str]:
  """The run's noise line, and its warnings where the noise swamps the clip or, beside
  correlated noise, adaptive clipping's count (`count_stddev`). `update_noise`: the
  multiplier on the updates where adaptive clipping raised it above z (correlated
  noise: the report's round_noise_rms is at it, noise_note.reported_ratio)."""
  applied = update_noise if strategy is not None and update_noise else noise_multiplier
  ratio = mean_update_ratio(cfg, applied, strategy)
  if ratio is None:
    return []
  where = (f"calibrated to target_epsilon {cfg.target_epsilon:g} over {cfg.rounds} rounds, "
           f"{cfg.sampling} cohorts of {cfg.clients_per_round} of {cfg.num_clients}"
           if calibrated else "as configured")
  each = ("each round" if strategy is None else
          f"each round, root mean square over the rounds ({strategy.says}; sensitivity "
          f"{math.sqrt(strategy.sensitivity2):.4g})")
  out = [f"dp {cfg.dp}: noise multiplier {noise_multiplier:.4g} ({where}): noise std "
         f"{ratio:.3g} x clip_norm on the mean update {each}"]
  if ratio > SWAMPED:
    out.append(f"warning: the noise on the mean update (std {ratio:.3g} x clip_norm) is larger "
               "than the clipped updates themselves and will likely swamp them: more clients "
               "per round, a larger target_epsilon or fewer rounds lower it")
  if strategy is not None and count_stddev > COUNT_WANDERS * cfg.clients_per_round:
    out.append(f"warning: adaptive clipping's count noise (std {count_stddev:.3g}, "
               f"{count_stddev / cfg.clients_per_round:.2f} of the cohort) grows with a "
               "client's participations beside correlated noise: the clip norm will wander "
               "more than it follows the target quantile; a separated sampling (fewer "
               "participations) or a fixed clip_norm avoids it")
  return out


COUNT_WANDERS = 0.25  # the count's noise std over the cohort above which the clip wanders
