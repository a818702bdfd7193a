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


AGGREGATOR = Aggregator(name="filtered_mean", aggregate=on_finite_uploads(_aggregate),
                        hparams=lambda cfg: {"cos_min": cfg.filter_cosine, "z": cfg.outlier_z},
                        reports=("flagged",), keys=("filter_cosine", "outlier_z"))
