"""cluster: clients clustered by the cosine similarity of their updates (above
`cluster_threshold`, connected components), weighted means within clusters,
then one vote per cluster. clusters: how many formed.

Its metrics also say which cluster each upload fell in, for the cluster-noise
server stage (each client's next local noise set by its cluster's size):
cluster_mask [m] (the finite participants the clusters are of), cluster_size [m]
(the size of each upload's cluster) and cluster_median (the median cluster size).
A run without that stage never reads them, and the compiled program leaves them out."""

import jax.numpy as jnp

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  labels = ra.cosine_clusters(u, mask, hp["threshold"])
  agg, k = ra.clustered_mean(u, mask, weights, hp["threshold"], labels)
  same = (labels[:, None] == labels[None, :]) & mask[None, :]
  size = jnp.sum(same, axis=1).astype(jnp.float32)                     # [m]
  heads = mask & (labels == jnp.arange(labels.shape[0]))                # one per cluster
  median = ra.coordinate_median(size[:, None], heads)[0]
  return agg, state, {**metrics(clusters=k), "cluster_mask": mask, "cluster_size": size,
                      "cluster_median": median}


_AGGREGATE = on_finite_uploads(_aggregate)


def cluster(threshold: float = 0.5) -> Aggregator:
  """Clusters joined at cosine similarity `threshold`; the largest cluster's mean."""
  return Aggregator(name="cluster", aggregate=_AGGREGATE, hparams={"threshold": threshold},
                    reports=("clusters",), labels_clusters=True)
