"""The run's DP set-up read from its config (the edge: nothing below reads the
config's DP keys).

  make_privacy(cfg, ...)  privacy/setup.Privacy: the clip layout, the noise
                          multipliers (calibrated to target_epsilon), the accounted
                          event's RDP
  event_rdp, noise_multiplier_for, sampling_rate, cohort_sampling, clip_count_stddev
                          the accounted event of one round or participation (the
                          mechanism's event_rdp at the config's sampling)
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import Model
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import clip_layout
from fedjax_dp.privacy import noise_control
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy.mechanisms import correlated
from fedjax_dp.privacy.mechanisms.base import SCORE_GRID, CohortSampling, poisson_rate_used
from fedjax_dp.privacy.setup import Privacy
from fedjax_dp.recipes import flat


def sampling_rate(cfg: Config) -> float:
  """The rate a client joins a round with: m / N (fixed-size cohorts), or under
  Poisson sampling the rate `sample_cohort` really draws with, which the
  accountant charges (`poisson_rate_used`)."""
  q = cfg.clients_per_round / cfg.num_clients
  return poisson_rate_used(q) if cfg.sampling == "poisson" else q


def make_privacy(cfg: Config, model: Model, feature_tiers=None,
                 calibrated: float | None = None) -> Privacy:
  """Resolves the config's DP keys: clip layout, noise multipliers, the accounted event.

  `calibrated`: under central DP with target_epsilon, the accounted multiplier to
  use instead of calibrating from round 0 (a resumed run keeps the multiplier its
  rounds were calibrated to; see runner.calibrated_multiplier)."""
  mechanism = mechanisms.get_mechanism(cfg.dp)
  if not mechanism.private:
    return Privacy(mode=cfg.dp)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  if cfg.clip_parts == "tiers":
    from fedjax_dp.data.tabular import TIERS
    if feature_tiers is None:
      raise ValueError("clip_parts 'tiers' needs data with sensitivity tiers (dataset "
                       "healthcare, or csv or breast_cancer with tier_map_path)")
    layout = clip_layout.tier_layout(shapes, feature_tiers, TIERS.index(cfg.rest_tier),
                                    cfg.tier_noise_multipliers)
  else:
    layout = clip_layout.clip_layout(shapes, cfg.clip_parts)
  tier_scales = layout.noise_scales or (1.0,) * len(layout.fractions)
  # z_accounted = z * ratio(score): the composed parts' multiplier at controller output
  # `score`; the noise is least, the ratio smallest, at score 1
  ratio = lambda score: accounting.effective_noise_multiplier(clip_layout.part_noise_multipliers(
      layout._replace(noise_scales=tuple(np.asarray(noise_control.noise_scales(
          cfg.noise_schedule, score, tier_scales, cfg.convergence_beta), np.float64))), 1.0))
  if cfg.noise_multiplier is None and mechanism.calibrates_to_target:
    # calibrate the accounted multiplier to target_epsilon, then the base z so that
    # even the least-noise rounds (score 1) stay within it
    z = (noise_multiplier_for(cfg) if calibrated is None else calibrated) / ratio(1.0)
  else:
    z = noise_multiplier_for(cfg)
  count_stddev = 0.0
  z_update = z
  # per-part bounds with isotropic noise compose to one Gaussian with multiplier z
  z_accounted = accounting.effective_noise_multiplier(
      clip_layout.part_noise_multipliers(layout, z)) if z > 0 else 0.0
  strategy, schedule = _strategy(cfg, mechanism)
  if cfg.adaptive_clipping and z > 0 and strategy is not None:
    # correlated noise: k_c count queries of std s (sensitivity 1/2) beside the
    # strategy's Gaussian (privacy/mechanisms/correlated.py), composed to one Gaussian
    # of multiplier z; the default s keeps z_u within 1.155 z, as central DP's
    k_c = correlated.count_queries(strategy, schedule)
    count_stddev = clip_count_stddev(cfg, z * math.sqrt(k_c))
    try:
      z_update = correlated.update_noise_multiplier(z, count_stddev, k_c)
    except ValueError as e:
      raise ConfigError(f"config key 'clip_count_stddev' = {count_stddev:g}: {e}") from None
    z_accounted = (z_update ** -2 + k_c / (2.0 * count_stddev) ** 2) ** -0.5
    strategy = correlated.with_count_charges(strategy, schedule, cfg.rounds)
  elif cfg.adaptive_clipping and z > 0:
    # the count query is one more Gaussian on the same record (sensitivity 1/2,
    # multiplier 2 s); the updates' noise is raised so that the pair composes to
    # z_accounted, whatever the parts' weights (tiers: z_accounted = z / sqrt(S))
    weight = (z / z_accounted) ** 2     # S = sum_p (f_p / scale_p)^2
    count_stddev = clip_count_stddev(cfg, z_accounted)
    try:
      z_update = clip_layout.update_noise_multiplier(z, count_stddev, weight)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    # composed from the noise actually applied, not assumed: (S / z_u^2 + 1/(2 s)^2)^(-1/2)
    z_accounted = accounting.effective_noise_multiplier(
        clip_layout.part_noise_multipliers(layout, z_update) + [2.0 * count_stddev])
  event = event_rdp(cfg, z_accounted)
  table = None
  multipliers = (z_accounted,)
  if mechanism.noises_sum and cfg.noise_schedule != "static" and z > 0:
    # (recipes/validate.py refuses adaptive clipping with a schedule: no count part here)
    multipliers = tuple(z * ratio(k / (SCORE_GRID - 1)) for k in range(SCORE_GRID))
    table = np.stack([accounting.event_to_float32(event_rdp(cfg, m)) for m in multipliers])
  return Privacy(mode=cfg.dp, layout=layout, update_noise_multiplier=z_update,
                 noise_multiplier=z, accounted_noise_multiplier=z_accounted, event_rdp=event,
                 target_epsilon=cfg.target_epsilon,
                 delta=cfg.delta, adaptive=cfg.adaptive_clipping, count_stddev=count_stddev,
                 schedule=cfg.noise_schedule, event_table=table, event_multipliers=multipliers,
                 strategy=strategy, participation=schedule,
                 stop_in_round=(mechanism.noises_sum and cfg.target_epsilon is not None
                                and (cfg.clip_parts == "tiers" or cfg.noise_schedule != "static")))


def participation_of(cfg: Config):
  """The sampler's participation schema (placement/participation.py): the function
  the cohort sampler is built from, so the accountant reads what the run enforces."""
  from fedjax_dp.placement import participation
  return participation.schema(cfg.sampling, cfg.num_clients, cfg.clients_per_round, cfg.rounds,
                              cfg.min_separation)


def _strategy(cfg: Config, mechanism):
  """(a correlated-noise mechanism's Strategy for this run, the participation) or
  (None, the participation)."""
  schedule = participation_of(cfg)
  if mechanism.strategy_for is None:
    return None, schedule
  settings = {k: getattr(cfg, k) for k in mechanism.reads}
  settings["server_momentum"] = (cfg.server_momentum if
                                 flat.server_optimizer_name(cfg) == "momentum" else 0.0)
  # the server's learning rate over the rounds, as the round applies it (1.0: constant)
  if cfg.server_lr_schedule == "cosine":
    from fedjax_dp.training.server import cosine_factor
    settings["server_lr_decay"] = cfg.server_lr_min / cfg.server_lr
    settings["server_lr_rates"] = cosine_factor(np.arange(cfg.rounds), cfg.rounds,
                                                settings["server_lr_decay"])
  try:
    return mechanism.strategy_for(settings, schedule, cfg.rounds), schedule
  except ValueError as e:
    raise ConfigError(str(e)) from None


def clip_count_stddev(cfg: Config, accounted_multiplier: float) -> float:
  """Std of the noise on the clipped count. Default: Andrew et al.'s m / 20, raised
  to the accounted noise multiplier where that is larger (small cohorts, or tiers
  whose composed multiplier is above z; correlated noise passes z sqrt(k) for a
  client's k count queries), so that the updates' noise grows by at most
  (1 - 1/4)^(-1/2) = 1.155x."""
  if cfg.clip_count_stddev is not None:
    return cfg.clip_count_stddev
  return max(cfg.clients_per_round / 20.0, accounted_multiplier)


def cohort_sampling(cfg: Config) -> CohortSampling:
  return CohortSampling(cfg.sampling, cfg.clients_per_round, cfg.num_clients,
                        participation_of(cfg))


def event_rdp(cfg: Config, noise_multiplier: float) -> np.ndarray:
  """RDP of what the config's mechanism charges per round (or participation) at
  accounted multiplier `noise_multiplier` (its module says which)."""
  return mechanisms.get_mechanism(cfg.dp).event_rdp(noise_multiplier, cohort_sampling(cfg))


@functools.lru_cache(maxsize=16)
def noise_multiplier_for(cfg: Config) -> float:
  """The configured noise multiplier, or the one that reaches target_epsilon in `rounds`.

  It aims a hair below the target (1e-5 relative, plus the in-round float32
  ledger's worst-case upward drift of 3e-7 per round), so that the budget check,
  which sees the rounded-up ledger, lets all `rounds` rounds run."""
  if cfg.noise_multiplier is not None:
    return cfg.noise_multiplier
  aim = cfg.target_epsilon * (1.0 - 1e-5 - 3e-7 * cfg.rounds)
  # a mechanism charged once per run (correlated noise: one Gaussian) composes once
  times = 1 if mechanisms.get_mechanism(cfg.dp).charged_once else cfg.rounds
  return accounting.calibrate_noise_multiplier(
      aim, sampling_rate(cfg), cfg.rounds, cfg.delta,
      epsilon_fn=lambda z: accounting.epsilon_np(times * event_rdp(cfg, z), cfg.delta)[0])
