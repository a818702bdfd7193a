"""The aggregators by name. A new rule is one module and one line here."""

from __future__ import annotations

from fedjax_dp.robust import (centered_clip, cluster, filtered_mean, geometric_median, krum,
                              mean, median, outlier_median, trimmed_mean)
from fedjax_dp.robust.base import Aggregator

AGGREGATORS: dict[str, Aggregator] = {a.name: a for a in (
    mean.AGGREGATOR,
    median.AGGREGATOR,
    trimmed_mean.AGGREGATOR,
    krum.KRUM,
    krum.MULTI_KRUM,
    outlier_median.AGGREGATOR,
    cluster.AGGREGATOR,
    geometric_median.AGGREGATOR,
    centered_clip.AGGREGATOR,
    filtered_mean.AGGREGATOR,
)}


def register_aggregator(aggregator: Aggregator) -> None:
  """Adds `aggregator` at run time (e.g. from user code)."""
  if aggregator.name in AGGREGATORS:
    raise ValueError(f"an aggregator {aggregator.name!r} is already registered")
  if aggregator.linear:
    # `linear` tells the round it may run its own fused weighted mean instead of
    # calling `aggregate`: a user's rule so marked would never run
    raise ValueError(f"aggregator {aggregator.name!r}: linear=True means the built-in "
                     "weighted mean (the round fuses it and never calls aggregate); register "
                     "your rule with linear=False")
  AGGREGATORS[aggregator.name] = aggregator


def get_aggregator(name: str) -> Aggregator:
  try:
    return AGGREGATORS[name]
  except KeyError:
    raise ValueError(f"aggregator {name!r}: allowed are {', '.join(AGGREGATORS)}") from None
