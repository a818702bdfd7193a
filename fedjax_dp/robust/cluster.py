"""cluster: clients clustered by the cosine similarity of their updates (above
`cluster_threshold`, connected components), weighted means within clusters,
then one vote per cluster. clusters: how many formed.

Built with noise='equalize' (config key cluster_noise), the rule also keeps, in its
state, each client's last cluster size and the round's median cluster size, and
sets each client's next local noise from them (`client_noise`: per-cluster noise,
noise_control.cluster_noise_factors); local DP charges each client for its own."""

import jax.numpy as jnp

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.privacy.noise_control import cluster_noise_factors
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads

NOISE = ("uniform", "equalize")


def _clusters(u, mask, weights, state, hp):
  """(aggregate, state, metrics with each upload's cluster size [m] and the median)."""
  labels = ra.cosine_clusters(u, mask, hp["threshold"])
  agg, k = ra.clustered_mean(u, mask, weights, hp["threshold"], labels)
  same = (labels[:, None] == labels[None, :]) & mask[None, :]
  size = jnp.sum(same, axis=1).astype(jnp.float32)                     # [m]
  heads = mask & (labels == jnp.arange(labels.shape[0]))                # one per cluster
  median = ra.coordinate_median(size[:, None], heads)[0]
  return agg, state, {**metrics(clusters=k), "clustered": mask, "cluster_size": size,
                      "cluster_median": median}


_AGGREGATE = on_finite_uploads(_clusters)


def _plain(u, mask, weights, state, hp):
  agg, state, m = _AGGREGATE(u, mask, weights, state, hp)
  return agg, state, metrics(flagged=m["flagged"], clusters=m["clusters"])


def _equalizing(u, mask, weights, state, hp, ids):
  """The clusters' aggregate; each clustered client's size and the median kept in
  the state (a client not clustered this round keeps its last; no cluster, no new
  median)."""
  agg, _, m = _AGGREGATE(u, mask, weights, (), hp)
  clustered = m["clustered"]
  where = jnp.where(clustered, ids, state["size"].shape[0])   # others drop
  state = {"size": state["size"].at[where].set(m["cluster_size"], mode="drop"),
           "median": jnp.where(jnp.any(clustered), m["cluster_median"], state["median"])}
  return agg, state, metrics(flagged=m["flagged"], clusters=m["clusters"])


def _sizes(d: int, num_clients: int) -> dict:
  return {"size": jnp.zeros((num_clients,), jnp.float32), "median": jnp.float32(0.0)}


def _factors(state) -> jnp.ndarray:
  return cluster_noise_factors(state["size"], state["median"])


def cluster(threshold: float = 0.5, noise: str = "uniform") -> Aggregator:
  """Clusters joined at cosine similarity `threshold`; the largest cluster's mean.
  noise 'equalize': each client's next local noise follows its cluster's size."""
  if noise not in NOISE:
    raise ValueError(f"cluster noise {noise!r}: allowed are {', '.join(NOISE)}")
  if noise == "uniform":
    return Aggregator(name="cluster", aggregate=_plain, hparams={"threshold": threshold},
                      reports=("clusters",))
  return Aggregator(name="cluster", aggregate=_equalizing, hparams={"threshold": threshold},
                    reports=("clusters",), init=_sizes, stateful=True, takes_ids=True,
                    client_noise=_factors)
