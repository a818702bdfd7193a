"""filtered_mean: gradient filtering, the dynamic-DP paper's defense against
backdoors (Table 5). The paper names it and says no more; our reading drops a
participant whose update points away from the round's coordinate-wise median
(cosine below `filter_cosine`) or whose norm is an outlier (robust z-score of
the norms above `outlier_z`), and takes the weighted mean of the rest (the
median if none is left). flagged: the dropped participants."""

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _aggregate(u, mask, weights, state, hp):
  agg, dropped = ra.filtered_mean(u, mask, weights, hp["cos_min"], hp["z"])
  return agg, state, metrics(dropped)


_AGGREGATE = on_finite_uploads(_aggregate)


def filtered_mean(cos_min: float = 0.0, z: float = 3.5) -> Aggregator:
  """The mean of the uploads whose cosine with the median is >= `cos_min` and whose
  norm's robust z-score is <= `z`."""
  return Aggregator(name="filtered_mean", aggregate=_AGGREGATE,
                    hparams={"cos_min": cos_min, "z": z}, reports=("flagged",))
