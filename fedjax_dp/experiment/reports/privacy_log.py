"""The run's record of what each round released, kept by the host.

The compiled rounds report, per round, which noise the accountant charged
(`RoundStats.event`, an index into `Privacy.event_multipliers`) and the
clients' learning rate (`RoundStats.lr`). The host folds them into a log of
runs of equal values,

  {"noise": [[z, rounds], ...],   accounted noise multiplier of each released
                                  round (central DP), in order
   "lr":    [[lr, rounds], ...],  the clients' learning rate of every round run
   "nonfinite": int}              uploads replaced by zero (diagnostic)

which travels with the state in every checkpoint. Reports are composed from
this log, never re-derived from today's config: a resume that recalibrates
the noise, a changed `rounds` under a learning-rate schedule, tiers and
adaptive clipping are then accounted as they ran.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np


def empty() -> dict:
  return {"noise": [], "lr": [], "nonfinite": 0}


def _extend(runs: list, values: Iterable[float]) -> None:
  """Appends `values` to `runs` in place (a copy per chunk grew as rounds^2)."""
  for v in values:
    if runs and runs[-1][0] == v:
      runs[-1][1] += 1
    else:
      runs.append([v, 1])


def append(log: dict, stats, event_multipliers) -> dict:
  """Adds a chunk whose RoundStats (leaves [rounds]) are `stats` to `log` (in
  place) and returns it."""
  events = np.asarray(stats.event).reshape(-1)
  _extend(log["noise"], [float(event_multipliers[k]) for k in events if k >= 0])
  _extend(log["lr"], [float(v) for v in np.asarray(stats.lr, np.float32).reshape(-1)])
  log["nonfinite"] = int(log["nonfinite"]) + int(np.sum(stats.nonfinite))
  return log


def noise_events(log: dict) -> list[tuple[float, int]]:
  """[(accounted noise multiplier, rounds)] of the released rounds, in order."""
  return [(float(z), int(n)) for z, n in log["noise"]]


def released_rounds(log: dict) -> int:
  return sum(n for _, n in noise_events(log))


def round_lrs(log: dict) -> list[float]:
  """The learning rate of every round run, one per round."""
  return [float(v) for v, n in log["lr"] for _ in range(int(n))]


def composed_rdp(log: dict, event_rdp) -> np.ndarray:
  """float64 [orders]: sum over released rounds of event_rdp(z) (RDP adds)."""
  total = 0.0
  for z, n in noise_events(log):
    total = total + n * np.asarray(event_rdp(z), np.float64)
  return np.asarray(total, np.float64)


def is_valid(log) -> bool:
  """A log as saved by `append` (checkpoints from before the log have none)."""
  return (isinstance(log, dict) and all(k in log for k in ("noise", "lr", "nonfinite"))
          and all(isinstance(r, list) and len(r) == 2 for r in log["noise"] + log["lr"]))
