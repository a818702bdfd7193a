"""`fedjax-dp account` against dp-accounting: 10,000 Poisson-subsampled Gaussian steps.

  python benchmarks/accountant.py   # prints JSON: medians of 5, both in this process
"""

import json
import statistics
import time

import dp_accounting
from dp_accounting import rdp

from fedjax_dp.privacy import accounting, planning
from fedjax_dp.privacy.planning import pld_epsilon

Q, Z, STEPS, DELTA = 0.01, 1.1, 10000, 1e-5


def median_time(fn, repeats=5):
  times, value = [], None
  for _ in range(repeats):
    t = time.perf_counter()
    value = fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times), value


def oracle_rdp():
  a = rdp.RdpAccountant()
  a.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(Z)), STEPS)
  return a.get_epsilon(DELTA)


def oracle_pld():
  from dp_accounting.pld import pld_privacy_accountant
  a = pld_privacy_accountant.PLDAccountant()
  a.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(Z)), STEPS)
  return a.get_epsilon(DELTA)


def computed(fn, *memos):
  """fn with the per-process memos cleared first: each repeat computes the curve."""
  def run():
    for memo in memos:
      memo.cache_clear()
    return fn()
  return run


if __name__ == "__main__":
  ours_rdp = median_time(computed(lambda: accounting.dpsgd_epsilon(Q, Z, STEPS, DELTA)[0],
                                  accounting._poisson_gaussian_rdp))
  theirs_rdp = median_time(oracle_rdp)
  ours_pld = median_time(computed(lambda: pld_epsilon(Q, Z, STEPS, DELTA),
                                  planning._pld_epsilon_composed))
  theirs_pld = median_time(oracle_pld)
  print(json.dumps({
      "setting": {"q": Q, "noise_multiplier": Z, "steps": STEPS, "delta": DELTA},
      "rdp": {"ours_s": ours_rdp[0], "dp_accounting_s": theirs_rdp[0], "ours_eps": ours_rdp[1],
              "dp_accounting_eps": theirs_rdp[1], "time_ratio": ours_rdp[0] / theirs_rdp[0]},
      "pld": {"ours_s": ours_pld[0], "dp_accounting_s": theirs_pld[0], "ours_eps": ours_pld[1],
              "dp_accounting_eps": theirs_pld[1]},
  }, indent=2))
