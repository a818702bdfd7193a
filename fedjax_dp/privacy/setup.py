"""The static DP set-up of a run, resolved from the config.

  Privacy                 what the compiled round applies and charges: mode, clip
                          layout, noise multipliers, the accounted event's RDP
  make_privacy(cfg, ...)  resolves it (calibrating the noise to target_epsilon)
  round_event_rdp, local_event_rdp, noise_multiplier_for, sampling_rate, ...
                          the accounted event of one round or participation
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import Model
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy import noise_control
from fedjax_dp.privacy.dp_round import SCORE_GRID


@dataclasses.dataclass(frozen=True)
class Privacy:
  """The static DP set-up of a compiled round (resolved from the config)."""
  mode: str = "none"               # none | central | local
  layout: Any = None               # mechanisms.ClipLayout
  update_noise_multiplier: float = 0.0  # std of the noise on updates / clip norm
  noise_multiplier: float = 0.0    # what the accountant charges (z)
  accounted_noise_multiplier: float = 0.0  # the parts' noise composed into one Gaussian
                                           # (tiers: below z; 0 without noise)
  event_rdp: Any = None            # np [orders]: RDP of one round (central) or one participation (local)
  target_epsilon: float | None = None
  delta: float = 1e-5
  adaptive: bool = False
  count_stddev: float = 0.0
  schedule: str = "static"         # noise_control.SCHEDULES (local DP)
  client_budgets: Any = None       # np [num_clients] per-client target epsilons (None: target_epsilon)
  event_table: Any = None          # np [SCORE_GRID, orders]: central DP's round RDP at controller
                                   # outputs k / (SCORE_GRID - 1) (adaptive noise)
  stop_in_round: bool = False      # central DP: a round that would pass target_epsilon is skipped
  event_multipliers: tuple = ()    # float64: the accounted multiplier of each event a round can
                                   # release (RoundStats.event indexes it): one with static
                                   # noise, central DP's SCORE_GRID tabulated ones with a schedule

  def tier_scales(self) -> tuple[float, ...]:
    """The static per-part noise multipliers (all 1 without tiers)."""
    return self.layout.noise_scales or (1.0,) * len(self.layout.fractions)


def sampling_rate(cfg: Config) -> float:
  """The rate a client joins a round with: m / N (fixed-size cohorts), or under
  Poisson sampling the rate `sample_cohort` really draws with, which the
  accountant charges (`poisson_rate_used`)."""
  q = cfg.clients_per_round / cfg.num_clients
  return poisson_rate_used(q) if cfg.sampling == "poisson" else q


def poisson_rate_used(q: float) -> float:
  """P(u < float32(q)) for jax.random.bernoulli's u, uniform on the grid j / 2^23
  (float32 mantissa bits), j = 0 .. 2^23 - 1: ceil(float32(q) 2^23) / 2^23, exact
  in float64. It differs from q by at most 2^-23 (e.g. 0.1 -> 0.10000002384)."""
  return min(1.0, math.ceil(float(np.float32(q)) * 2.0 ** 23) / 2.0 ** 23)


def make_privacy(cfg: Config, model: Model, feature_tiers=None,
                 calibrated: float | None = None) -> Privacy:
  """Resolves the config's DP keys: clip layout, noise multipliers, the accounted event.

  `calibrated`: under central DP with target_epsilon, the accounted multiplier to
  use instead of calibrating from round 0 (a resumed run keeps the multiplier its
  rounds were calibrated to; see runner.calibrated_multiplier)."""
  if cfg.dp == "none":
    return Privacy()
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  if cfg.clip_parts == "tiers":
    from fedjax_dp.data.tabular import TIERS
    if feature_tiers is None:
      raise ValueError("clip_parts 'tiers' needs data with sensitivity tiers (dataset "
                       "healthcare, or csv or breast_cancer with tier_map_path)")
    layout = mechanisms.tier_layout(shapes, feature_tiers, TIERS.index(cfg.rest_tier),
                                    cfg.tier_noise_multipliers)
  else:
    layout = mechanisms.clip_layout(shapes, cfg.clip_parts)
  tier_scales = layout.noise_scales or (1.0,) * len(layout.fractions)
  # z_accounted = z * ratio(score): the composed parts' multiplier at controller output
  # `score`; the noise is least, the ratio smallest, at score 1
  ratio = lambda score: accounting.effective_noise_multiplier(mechanisms.part_noise_multipliers(
      layout._replace(noise_scales=tuple(np.asarray(noise_control.noise_scales(
          cfg.noise_schedule, score, tier_scales, cfg.convergence_beta), np.float64))), 1.0))
  if cfg.noise_multiplier is None and cfg.dp == "central":
    # calibrate the accounted multiplier to target_epsilon, then the base z so that
    # even the least-noise rounds (score 1) stay within it
    z = (noise_multiplier_for(cfg) if calibrated is None else calibrated) / ratio(1.0)
  else:
    z = noise_multiplier_for(cfg)
  count_stddev = 0.0
  z_update = z
  # per-part bounds with isotropic noise compose to one Gaussian with multiplier z
  z_accounted = accounting.effective_noise_multiplier(
      mechanisms.part_noise_multipliers(layout, z)) if z > 0 else 0.0
  if cfg.adaptive_clipping and z > 0:
    # the count query is one more Gaussian on the same record (sensitivity 1/2,
    # multiplier 2 s); the updates' noise is raised so that the pair composes to
    # z_accounted, whatever the parts' weights (tiers: z_accounted = z / sqrt(S))
    weight = (z / z_accounted) ** 2     # S = sum_p (f_p / scale_p)^2
    count_stddev = clip_count_stddev(cfg, z_accounted)
    try:
      z_update = mechanisms.update_noise_multiplier(z, count_stddev, weight)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    # composed from the noise actually applied, not assumed: (S / z_u^2 + 1/(2 s)^2)^(-1/2)
    z_accounted = accounting.effective_noise_multiplier(
        mechanisms.part_noise_multipliers(layout, z_update) + [2.0 * count_stddev])
  event = (local_event_rdp(cfg, z_accounted) if cfg.dp == "local"
           else round_event_rdp(cfg, z_accounted))
  table = None
  multipliers = (z_accounted,)
  if cfg.dp == "central" and cfg.noise_schedule != "static" and z > 0:
    # (recipes/validate.py refuses adaptive clipping with a schedule: no count part here)
    multipliers = tuple(z * ratio(k / (SCORE_GRID - 1)) for k in range(SCORE_GRID))
    table = np.stack([accounting.event_to_float32(round_event_rdp(cfg, m)) for m in multipliers])
  return Privacy(mode=cfg.dp, layout=layout, update_noise_multiplier=z_update,
                 noise_multiplier=z, accounted_noise_multiplier=z_accounted, event_rdp=event,
                 target_epsilon=cfg.target_epsilon,
                 delta=cfg.delta, adaptive=cfg.adaptive_clipping, count_stddev=count_stddev,
                 schedule=cfg.noise_schedule, event_table=table, event_multipliers=multipliers,
                 stop_in_round=(cfg.dp == "central" and cfg.target_epsilon is not None
                                and (cfg.clip_parts == "tiers" or cfg.noise_schedule != "static")))


def clip_count_stddev(cfg: Config, accounted_multiplier: float) -> float:
  """Std of the noise on the clipped count. Default: Andrew et al.'s m / 20, raised
  to the accounted noise multiplier where that is larger (small cohorts, or tiers
  whose composed multiplier is above z), so that the updates' noise grows by at
  most (1 - 1/4)^(-1/2) = 1.155x."""
  if cfg.clip_count_stddev is not None:
    return cfg.clip_count_stddev
  return max(cfg.clients_per_round / 20.0, accounted_multiplier)


def local_event_rdp(cfg: Config, noise_multiplier: float) -> np.ndarray:
  """RDP of one participation under local DP: the client's own clipped update
  with N(0, (z C)^2), released whole (no amplification by sampling), replace-one
  (sensitivity 2C, so multiplier z / 2). Infinite without noise."""
  if noise_multiplier == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  return accounting.gaussian_rdp(noise_multiplier / 2)


def round_event_rdp(cfg: Config, noise_multiplier: float) -> np.ndarray:
  """RDP of one central-DP round, N(0, (z C)^2) on the sum of updates clipped to C:
    sampling 'poisson': Poisson-subsampled Gaussian, add/remove-one client
      (sensitivity C, multiplier z);
    sampling 'fixed': exactly clients_per_round of num_clients without replacement,
      replace-one client (sensitivity 2C, so multiplier z / 2; WBK 2019).
  Infinite without noise."""
  return _round_event_rdp(cfg.sampling, cfg.clients_per_round, cfg.num_clients,
                          float(noise_multiplier)).copy()


@functools.lru_cache(maxsize=4096)
def _round_event_rdp(sampling: str, per_round: int, num_clients: int, z: float) -> np.ndarray:
  """round_event_rdp by the values it depends on (cached: a calibration and a noise
  schedule's table each evaluate dozens of curves, at 0.1-0.2 s each)."""
  if z == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  if sampling == "fixed":
    return accounting.fixed_size_gaussian_rdp(per_round, num_clients, z / 2)
  q = per_round / num_clients
  return accounting.poisson_gaussian_rdp(poisson_rate_used(q), z)


def neighbouring_relation(cfg: Config) -> str:
  if cfg.sampling == "fixed":
    return "replace one client (fixed-size cohorts; sensitivity 2 clip_norm)"
  return "add/remove one client (Poisson sampling; sensitivity clip_norm)"


@functools.lru_cache(maxsize=16)
def noise_multiplier_for(cfg: Config) -> float:
  """The configured noise multiplier, or the one that reaches target_epsilon in `rounds`.

  It aims a hair below the target (1e-5 relative, plus the in-round float32
  ledger's worst-case upward drift of 3e-7 per round), so that the budget check,
  which sees the rounded-up ledger, lets all `rounds` rounds run."""
  if cfg.noise_multiplier is not None:
    return cfg.noise_multiplier
  aim = cfg.target_epsilon * (1.0 - 1e-5 - 3e-7 * cfg.rounds)
  return accounting.calibrate_noise_multiplier(
      aim, sampling_rate(cfg), cfg.rounds, cfg.delta,
      epsilon_fn=lambda z: accounting.epsilon_np(cfg.rounds * round_event_rdp(cfg, z),
                                                 cfg.delta)[0])
