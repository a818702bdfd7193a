"""The figures of a metrics.jsonl row that follow the config's privacy and aggregation rules.

What may be published about participation (expected cohorts under Poisson
sampling), the epsilon spent so far, and the robust aggregators' counts.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.core.simulation import Simulation
from fedjax_dp.experiment.reports.local_dp_report import clients_spent
from fedjax_dp.experiment.reports.privacy_report import (headline, mark_test_mode,
                                                         privacy_report, rounds_skipped)
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.flat import kept_noise_of


def expected_cohorts_only(cfg: Config) -> bool:
  """Under central DP with Poisson sampling the realised cohort sizes are private
  (add/remove-one neighbours change them), and under cyclic Poisson sampling they
  tell about the draws amplified BandMF's accountant takes as secret: what the run
  publishes about participation counts the expected cohort, clients_per_round per
  round that ran."""
  from fedjax_dp.placement.participation import SECRET_DRAWS
  return get_mechanism(cfg.dp).noises_sum and cfg.sampling in SECRET_DRAWS


def published_participations(cfg: Config, state) -> int:
  """The participations that bytes_up/bytes_down and the summary publish: the
  expected ones where the realised cohort sizes are private (expected_cohorts_only;
  skipped rounds released nothing), else the realised ones."""
  if expected_cohorts_only(cfg):
    ran = int(state.round) - rounds_skipped(cfg, state)
    return cfg.clients_per_round * ran
  return int(state.participations)


def aggregator_metrics(cfg, flagged: float, clusters: float, rounds: int,
                       bounded: float) -> dict:
  """metrics.jsonl keys of the defenses, over the rounds since the last evaluation:
  `flagged` uploads (left out of the aggregate by Krum, gradient filtering or for
  not being finite; outliers the outlier switch detected; clipped by centred
  clipping) and the mean number of `clusters` per round, those the rule `reports`
  (robust/); `norm_bounded`, the uploads the server's norm bound clipped."""
  from fedjax_dp import robust
  reports = robust.get_aggregator(cfg.aggregator).reports
  out = {}
  if "flagged" in reports:
    out["flagged"] = int(flagged)
  if cfg.server_clip_l2 is not None:
    out["norm_bounded"] = int(bounded)
  if "clusters" in reports:
    out["clusters"] = clusters / rounds if rounds else None
  return out


def spent_epsilon(sim: Simulation, state, plog: dict | None,
                  test_mode: str | None = None) -> dict:
  """The run's guarantee so far, for metrics.jsonl: the privacy report's headline
  (privacy_report.headline: the same code, so the last row and summary.json agree),
  composed from the rounds' record `plog`; local DP gives the largest client's, and
  how many clients can no longer take part. `state` in either layout (Simulation.
  to_working): the per-client table is not read. `test_mode` (RunContext.test_mode):
  no epsilon, and why (privacy_report.mark_test_mode)."""
  cfg = sim.cfg
  if not get_mechanism(cfg.dp).private and kept_noise_of(cfg) is None:
    return {"epsilon": None, "delta": None}
  row = headline(mark_test_mode(privacy_report(cfg, sim, state, plog, assume=False), test_mode))
  if test_mode is not None:
    row["epsilon_why_none"] = test_mode
  if get_mechanism(cfg.dp).per_client_ledgers:
    row["clients_spent"] = int(np.sum(clients_spent(sim, state)))
  return row
