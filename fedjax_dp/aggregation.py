"""The server's aggregation rule (`aggregator`), over the cohort's flat uploads.

  mean             the weighted mean (FedAvg; the round keeps its fast psum path)
  median           coordinate-wise median of the participants
  trimmed_mean     coordinate-wise mean after dropping the `trim_fraction` smallest
                   and largest values of each coordinate
  krum             the participant update of least Krum score (Blanchard et al. 2017),
                   for at most `byzantine_f` Byzantine clients
  multi_krum       the mean of the `multi_krum_m` (default n - f) updates of least score
  outlier_median   the dynamic-DP paper's rule: the median when an outlier is detected,
                   else the weighted mean. The paper does not say how it detects one;
                   we flag an update whose distance to the coordinate-wise median has a
                   robust z-score (median / MAD) above `outlier_z`
  cluster          clients clustered by the cosine similarity of their updates
                   (> `cluster_threshold`, connected components), weighted means within
                   clusters, then one vote per cluster

The kernels are in kernels/robust_aggregation.py. Every rule but `mean` needs the
whole cohort's updates in one place: the round all-gathers them over the device
axis, and the rule runs replicated. They act on what the server receives, so with
local DP they are post-processing; with central DP (noise calibrated to a sum of
clipped updates) only `mean` keeps the guarantee, and the others are refused.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from fedjax_dp.kernels import robust_aggregation as ra

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "outlier_median",
               "cluster")


def make_aggregator(cfg) -> Callable:
  """(u [m, d], mask [m], weights [m]) -> (aggregate [d], flagged int32, clusters int32).

  flagged: outliers the rule detected (outlier_median) or updates it left out
  (krum, multi_krum), plus, for every rule but mean, participants dropped for a
  NaN or inf in their upload (ra.finite_participants); clusters: the number of
  clusters (cluster), else 0."""
  zero = jnp.zeros((), jnp.int32)
  name = cfg.aggregator
  if name == "mean":
    return lambda u, mask, w: (ra.weighted_mean(u, mask, w), zero, zero)
  rule = _robust_rule(cfg)

  def robust(u, mask, w):
    u, usable, dropped = ra.finite_participants(u, mask)
    agg, flagged, clusters = rule(u, usable, w)
    return agg, flagged + dropped, clusters
  return robust


def _robust_rule(cfg) -> Callable:
  zero = jnp.zeros((), jnp.int32)
  name = cfg.aggregator
  if name == "median":
    return lambda u, mask, w: (ra.coordinate_median(u, mask), zero, zero)
  if name == "trimmed_mean":
    return lambda u, mask, w: (ra.trimmed_mean(u, mask, beta=cfg.trim_fraction), zero, zero)
  if name in ("krum", "multi_krum"):
    def krum(u, mask, w):
      n = jnp.sum(mask, dtype=jnp.int32)
      keep = 1 if name == "krum" else (cfg.multi_krum_m or None)
      keep = jnp.maximum(n - cfg.byzantine_f, 1) if keep is None else jnp.int32(keep)
      return ra.krum(u, mask, f=cfg.byzantine_f, m_keep=keep), n - jnp.minimum(keep, n), zero
    return krum
  if name == "outlier_median":
    def outlier_median(u, mask, w):
      agg, flagged = ra.median_if_outliers(u, mask, w, cfg.outlier_z)
      return agg, flagged, zero
    return outlier_median
  if name == "cluster":
    def cluster(u, mask, w):
      agg, k = ra.clustered_mean(u, mask, w, cfg.cluster_threshold)
      return agg, zero, k
    return cluster
  raise ValueError(f"aggregator {name!r}: allowed are {', '.join(AGGREGATORS)}")
