"""mean: the example-weighted mean sum_i w_i u_i / sum_i w_i (FedAvg).

Linear: the round never calls `aggregate` but sums the uploads in its fused
psum path (and central DP noises that sum); this is the same rule on a
gathered cohort, for tests and tools."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics


def _aggregate(u, mask, weights, state, hp):
  return ra.weighted_mean(u, mask, weights), state, metrics()


def mean() -> Aggregator:
  """The weighted mean (linear: the round fuses it into its sum)."""
  return Aggregator(name="mean", aggregate=_aggregate, linear=True)
