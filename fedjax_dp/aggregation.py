"""The server's aggregation rule (`aggregator`): the old module name.

Each rule is now one module in fedjax_dp/robust/ implementing the Aggregator
protocol (robust/base.py), registered in robust/registry.py; see those for the
rules. `make_aggregator` keeps the old stateless call signature.
"""

from __future__ import annotations

from typing import Callable

from fedjax_dp.robust import AGGREGATORS as _REGISTRY
from fedjax_dp.robust import get_aggregator

AGGREGATORS = tuple(_REGISTRY)


def make_aggregator(cfg, d: int | None = None) -> Callable:
  """(u [m, d], mask [m], weights [m]) -> (aggregate [d], flagged int32, clusters int32),
  with cfg's hyperparameters; a stateful rule starts from its initial state each call.

  flagged: outliers the rule detected (outlier_median), updates it left out
  (krum, multi_krum) or clipped (centered_clip), plus, for every rule but mean,
  participants dropped for a NaN or inf in their upload (finite_participants);
  clusters: the number of clusters (cluster), else 0."""
  rule = get_aggregator(cfg.aggregator)
  hp = rule.hparams(cfg)

  def aggregate(u, mask, w):
    state = rule.init(u.shape[1] if d is None else d, cfg.num_clients)
    agg, _, metrics = rule.aggregate(u, mask, w, state, hp)
    return agg, metrics["flagged"], metrics["clusters"]
  return aggregate
