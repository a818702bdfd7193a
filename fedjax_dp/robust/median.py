"""median: the coordinate-wise median of the participants (the mean of the two
middle values when n is even); weights are not used."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  return ra.coordinate_median(u, mask), state, metrics()


_AGGREGATE = on_finite_uploads(_aggregate)


def median() -> Aggregator:
  """The coordinate-wise median."""
  return Aggregator(name="median", aggregate=_AGGREGATE)
