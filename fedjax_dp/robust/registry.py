"""The aggregators by name, each a constructor that takes its numbers. A new rule is
one module and one line here."""

from __future__ import annotations

from typing import Callable

from fedjax_dp import stage
from fedjax_dp.robust.base import Aggregator
from fedjax_dp.robust.centered_clip import centered_clip
from fedjax_dp.robust.cluster import cluster
from fedjax_dp.robust.filtered_mean import filtered_mean
from fedjax_dp.robust.geometric_median import geometric_median
from fedjax_dp.robust.krum import krum, multi_krum
from fedjax_dp.robust.mean import mean
from fedjax_dp.robust.median import median
from fedjax_dp.robust.outlier_median import outlier_median
from fedjax_dp.robust.trimmed_mean import trimmed_mean

# name -> constructor (keyword numbers -> Aggregator); constructor() has the defaults
AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
    "mean": mean,
    "median": median,
    "trimmed_mean": trimmed_mean,
    "krum": krum,
    "multi_krum": multi_krum,
    "outlier_median": outlier_median,
    "cluster": cluster,
    "geometric_median": geometric_median,
    "centered_clip": centered_clip,
    "filtered_mean": filtered_mean,
}


def register_aggregator(aggregator: Aggregator | Callable[..., Aggregator]) -> None:
  """Adds a rule at run time (e.g. from user code): its constructor (keyword numbers
  -> Aggregator), or an Aggregator whose numbers are fixed."""
  make = aggregator if callable(aggregator) else (lambda: aggregator)
  try:
    rule = make()
  except TypeError as e:   # a run without a config key for a number uses the default
    raise ValueError("an aggregator constructor must build its rule with no arguments, each "
                     f"number with a default ({e})") from None
  if rule.name in AGGREGATORS:
    raise ValueError(f"an aggregator {rule.name!r} is already registered")
  stage.check_declares(f"aggregator {rule.name!r}", rule.declares)
  if rule.client_noise is not None and not rule.stateful:
    raise ValueError(f"aggregator {rule.name!r}: client_noise reads the rule's state "
                     "(server_state['aggregator']); register it with stateful=True and an init")
  if {"flagged", "clusters"} & {name for name, *_ in rule.declares}:
    raise ValueError(f"aggregator {rule.name!r}: flagged and clusters are declared by the "
                     "run (as rows' figures); declare only the rule's own metrics")
  if rule.linear:
    # `linear` tells the round it may run its own fused weighted mean instead of
    # calling `aggregate`: a user's rule so marked would never run
    raise ValueError(f"aggregator {rule.name!r}: linear=True means the built-in "
                     "weighted mean (the round fuses it and never calls aggregate); register "
                     "your rule with linear=False")
  AGGREGATORS[rule.name] = make


def get_aggregator(name: str, **numbers) -> Aggregator:
  """The rule `name` built with `numbers` (its constructor's defaults for the rest;
  its static properties do not depend on them)."""
  try:
    make = AGGREGATORS[name]
  except KeyError:
    raise ValueError(f"aggregator {name!r}: allowed are {', '.join(AGGREGATORS)}") from None
  return make(**numbers)
