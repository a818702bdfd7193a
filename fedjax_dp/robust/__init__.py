"""The server's aggregation rules over the cohort's flat uploads, one module each.

  base.py              the Aggregator protocol (init, aggregate, static properties)
  mean.py              the weighted mean (FedAvg; linear: the round fuses it)
  median.py, trimmed_mean.py, krum.py (krum, multi_krum), outlier_median.py,
  cluster.py, geometric_median.py, centered_clip.py (stateful)
  registry.py          AGGREGATORS (name -> constructor taking its numbers)

The kernels of the older rules are in kernels/robust_aggregation.py. Every rule
but `mean` needs the whole cohort's updates in one place: the round all-gathers
them over the device axis and the rule runs replicated. They act on what the
server receives: with local DP they are post-processing; with central DP (noise
calibrated to a sum of clipped updates) only a linear rule keeps the guarantee,
and the others are refused (recipes/validate.py, from `linear`).
"""

from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads
from fedjax_dp.robust.registry import AGGREGATORS, get_aggregator, register_aggregator
