"""trimmed_mean: per coordinate, the mean after dropping the floor(beta n)
smallest and largest participant values (beta = `trim_fraction`)."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  return ra.trimmed_mean(u, mask, beta=hp["beta"]), state, metrics()


_AGGREGATE = on_finite_uploads(_aggregate)


def trimmed_mean(beta: float = 0.1) -> Aggregator:
  """The coordinate-wise mean after trimming a fraction `beta` at each end."""
  return Aggregator(name="trimmed_mean", aggregate=_AGGREGATE, hparams={"beta": beta})
