"""outlier_median: the dynamic-DP paper's rule, the coordinate-wise median when
an outlier is detected, else the weighted mean. The paper does not say how it
detects one; we flag an update whose distance to the coordinate-wise median has
a robust z-score (median / 1.4826 MAD) above z = `outlier_z`. flagged: the
outliers."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  agg, flagged = ra.median_if_outliers(u, mask, weights, hp["z"])
  return agg, state, metrics(flagged)


_AGGREGATE = on_finite_uploads(_aggregate)


def outlier_median(z: float = 3.5) -> Aggregator:
  """The mean of the uploads whose distance to the median has a robust z-score <= `z`."""
  return Aggregator(name="outlier_median", aggregate=_AGGREGATE, hparams={"z": z},
                    reports=("flagged",))
