"""Privacy: the static DP set-up of a compiled round: the mechanism's name, the
clip layout, the noise multipliers, the accounted event's RDP. It is made from the
run's config at the edge (recipes/privacy.py: make_privacy, which calibrates the
noise to target_epsilon); what runs below reads this record, never the config.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Privacy:
  """The static DP set-up of a compiled round (resolved from the config)."""
  mode: str = "none"               # the mechanism's registered name (privacy/mechanisms/)
  layout: Any = None               # clip_layout.ClipLayout
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
  strategy: Any = None             # a correlated-noise mechanism's Strategy
                                   # (privacy/mechanisms/correlated.py), built for the run
  participation: Any = None        # placement/participation.Participation: the sampler's schema
  event_multipliers: tuple = ()    # float64: the accounted multiplier of each event a round can
                                   # release (RoundStats.event indexes it): one with static
                                   # noise, central DP's SCORE_GRID tabulated ones with a schedule

  def tier_scales(self) -> tuple[float, ...]:
    """The static per-part noise multipliers (all 1 without tiers)."""
    return self.layout.noise_scales or (1.0,) * len(self.layout.fractions)
