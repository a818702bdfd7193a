"""cluster: clients clustered by the cosine similarity of their updates (above
`cluster_threshold`, connected components), weighted means within clusters,
then one vote per cluster. clusters: how many formed."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  agg, k = ra.clustered_mean(u, mask, weights, hp["threshold"])
  return agg, state, metrics(clusters=k)


_AGGREGATE = on_finite_uploads(_aggregate)


def cluster(threshold: float = 0.5) -> Aggregator:
  """Clusters joined at cosine similarity `threshold`; the largest cluster's mean."""
  return Aggregator(name="cluster", aggregate=_AGGREGATE, hparams={"threshold": threshold},
                    reports=("clusters",))
