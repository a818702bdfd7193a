"""Golden results: the refactors of the round (issue 19) keep every number bit for bit.

For each configuration below (together they cover every feature of the round)
the test runs four rounds as two compiled chunks on 1 and on 2 devices and
checks, against tests/golden/:
  report  the SHA-256 digest of the privacy report composed from the run's
          privacy log (sorted JSON; host arithmetic, the same on every machine);
  bits    the digests of every leaf of the final SimState (client order) and of
          every RoundStats field of every round, where this machine's kind is
          recorded (round_hashes.json, by golden_machine(): XLA:CPU's bits
          depend on the CPU's vector extensions and model, measured 2026-11-27:
          an AMD EPYC with AVX2 and two Intel Xeons with AVX-512 each computed
          other bits for 30 to 52 of the 52 cases);
  values  otherwise every leaf and field against the recorded values
          (round_values.npz) within VALUE_TOLERANCE of the leaf's largest entry,
          integers exactly: any change of a draw, a stage or a formula moves
          them by orders of magnitude more than another CPU's rounding does.

A change that alters numbers on purpose says so in its commit and records every
file anew from one machine; another machine may then add its own bits (after
its values are checked against the recorded ones):

  .venv/bin/python tests/golden/regenerate.py record
  .venv/bin/python tests/golden/regenerate.py add-machine

(`make test` runs every configuration on 1 device and a third of them on 2; see
TWO_DEVICES_IN_MAKE_TEST. Run all of them with `make test-slow` before and after
moving code, on a machine whose bits are recorded.)
"""

import hashlib
import json
import os
import warnings

import jax
import numpy as np
import pytest

from fedjax_dp.experiment.reports import privacy_log
from fedjax_dp.experiment.reports.privacy_report import privacy_report
from fedjax_dp.core.build import build_simulation
from fedjax_dp.core.state import ATTRIBUTE_METRICS
from fedjax_dp.recipes.plan import plan_run
from fedjax_dp.data.tabular import TIERS
from tests.helpers import toy_problem, toy_simulation

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "round_hashes.json")
VALUES = os.path.join(os.path.dirname(__file__), "golden", "round_values.npz")
# another CPU's rounding after four rounds moved no leaf by more than 4.2e-6 of its
# largest entry (2026-11-27: an AMD EPYC with AVX2 and jax 0.10.2 against an Intel
# Xeon with AVX-512 and jax 0.11.2, regenerate.py compare); 24 times that
VALUE_TOLERANCE = 1e-4
# the hashes are XLA:CPU's bits; another backend's kernels sum in other orders
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="golden hashes are recorded on CPU")
SIZES = (7, 12, 3, 9, 5, 8)
FEATURE_TIERS = np.array([TIERS.index(t) for t in ("high", "high", "low", "public", "metadata",
                                                   "low")])

# name -> config overrides (toy_simulation's defaults: every client each round,
# lr 0.1, client momentum 0.5, two local epochs of batch 4, hidden [5])
CONFIGS = {
    "fedavg": dict(),
    "fedavgm_cosine_poisson": dict(algorithm="fedavgm", lr_schedule="cosine", lr_min=0.01,
                                   sampling="poisson", clients_per_round=3, max_cohort=6),
    "fedadam_fedprox_batched": dict(algorithm="fedadam+fedprox", prox_mu=0.1, client_batch=2,
                                    clients_per_round=4),
    "scaffold_contrastive": dict(algorithm="contrastive+scaffold", contrastive_mu2=0.05),
    "moon_params_fedadmm_vmap": dict(algorithm="contrastive+fedadmm",
                                     contrastive_form="moon_params", admm_rho=0.5,
                                     client_parallelism="vmap", clients_per_round=4),
    "moon": dict(algorithm="moon", clients_per_round=4),
    "solo": dict(algorithm="solo"),
    "topksdp_kept_noise": dict(algorithm="topksdp", s_local=0.5, s_global=0.5,
                               final_clip_l2=0.1, kept_noise="multiplier",
                               kept_noise_multiplier=1.0, lr_schedule="cosine"),
    "public_topk_kept_paper_client": dict(s_local=0.6, index_selection="public_topk",
                                          topk_kernel="bisect", final_clip_l2=0.1,
                                          kept_noise="paper", ldp_epsilon=5.0,
                                          kept_noise_draw="client", coordinate_clip=0.5,
                                          update_clip_l2=1.0),
    "random_k_no_feedback": dict(s_local=0.7, index_selection="random_k", error_feedback=False,
                                 clients_per_round=4),
    "median_byzantine": dict(aggregator="median", byzantine_fraction=0.34),
    "trimmed_mean_scaled": dict(aggregator="trimmed_mean", trim_fraction=0.2,
                                byzantine_fraction=0.2, byzantine_attack="scaled"),
    "krum_gaussian": dict(aggregator="krum", byzantine_f=1, byzantine_fraction=0.2,
                          byzantine_attack="gaussian"),
    "multi_krum_local_dp": dict(aggregator="multi_krum", byzantine_f=1, multi_krum_m=3,
                                dp="local", noise_multiplier=1.0),
    "outlier_median": dict(aggregator="outlier_median", byzantine_fraction=0.2),
    "central_flat_fixed": dict(dp="central", noise_multiplier=1.0, clients_per_round=4),
    "central_per_layer_poisson": dict(dp="central", noise_multiplier=0.8, clip_parts="per_layer",
                                      sampling="poisson", clients_per_round=3, max_cohort=6),
    "central_tiers_adaptive": dict(dp="central", noise_multiplier=1.0, clip_parts="tiers",
                                   adaptive_clipping=True, clients_per_round=4),
    "central_target_schedule": dict(dp="central", target_epsilon=8.0,
                                    noise_schedule="convergence", sampling="poisson",
                                    clients_per_round=3, max_cohort=6),
    "central_budget_stop": dict(dp="central", noise_multiplier=10.0, target_epsilon=4.5,
                                clip_parts="tiers", clients_per_round=3),
    "local_tiers_weighted": dict(dp="local", noise_multiplier=2.0, clip_parts="tiers",
                                 noise_schedule="weighted"),
    "local_budgets_per_client": dict(dp="local", noise_multiplier=1.5, target_epsilon=20.0,
                                     clients_per_round=4),
    "local_cluster_noise_shuffle": dict(dp="local", noise_multiplier=0.5, aggregator="cluster",
                                        cluster_threshold=0.2, cluster_noise="equalize"),
    "feddyn_geometric_median": dict(algorithm="feddyn", aggregator="geometric_median",
                                    byzantine_fraction=0.2, clients_per_round=4),
    "centered_clip_local_dp": dict(aggregator="centered_clip", cclip_tau=0.5, dp="local",
                                   noise_multiplier=1.0, byzantine_fraction=0.2),
    "shuffle_kept_aggregate": dict(s_local=0.5, shuffle="layerwise", final_clip_l2=0.2,
                                   kept_noise="multiplier", kept_noise_multiplier=0.5,
                                   kept_noise_draw="aggregate"),
}
TIERED = {"central_tiers_adaptive", "central_budget_stop", "local_tiers_weighted"}
BUDGETS = {"local_budgets_per_client": np.array([5.0, 20.0, 8.0, 30.0, 3.0, 12.0])}


def _digest(chunks) -> str:
  h = hashlib.sha256()
  for c in chunks:
    h.update(c)
  return h.hexdigest()[:20]


def state_digest(state) -> str:
  return _digest(np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(state))


# RoundStats' fields as recorded (before issue 40 moved the stages' counts into
# RoundStats.metrics; the four read there are its properties): the digests and
# values stay comparable, and a stage's metric beyond them is its own entry
STATS_FIELDS = ("loss_sum", "examples", "participants", "unclipped", "spent", "flagged",
                "clusters", "event", "lr", "nonfinite", "bounded")


def stats_fields(s) -> dict:
  """{name: value} of one chunk's RoundStats: STATS_FIELDS, then any other stage
  metric as '<stage>.<metric>' (none in the recorded cases)."""
  out = {f: getattr(s, f) for f in STATS_FIELDS}
  out.update({f"{stage}.{name}": v for stage, m in s.metrics.items() for name, v in m.items()
              if (stage, name) not in ATTRIBUTE_METRICS})
  return out


def stats_digest(stats) -> str:
  return _digest(np.asarray(v).tobytes() for s in stats for v in stats_fields(s).values())


def report_digest(sim, state, stats) -> str:
  """The privacy report composed from the rounds' statistics (its privacy log)."""
  plog = privacy_log.empty()
  for s in stats:
    plog = privacy_log.append(plog, s, sim.privacy.event_multipliers)
  report = privacy_report(sim.cfg, sim, state, plog)
  return _digest([json.dumps(report, sort_keys=True, default=str).encode()])


def case_simulation(name: str, devices: int):
  x, y, parts = toy_problem(sizes=SIZES)
  sim = toy_simulation(x, y, parts, devices=devices, rounds=4,
                       feature_tiers=FEATURE_TIERS if name in TIERED else None, **CONFIGS[name])
  if name in BUDGETS:
    sim = build_simulation(plan_run(sim.cfg, sim.model, client_budgets=BUDGETS[name]),
                           sim.model, sim.store, sim.mesh)
  return sim


def run_case(name: str, devices: int):
  """(simulation, final state, [RoundStats of each chunk]) of `name` run for 2 + 2
  rounds on `devices` devices."""
  sim = case_simulation(name, devices)
  state, stats = sim.init_state(), []
  for _ in range(2):
    state, s = sim.run_rounds(state, 2)
    stats.append(s)
  return sim, state, stats


def case_values(state, stats) -> dict:
  """Every leaf of the final state ("s<i>") and every field of every chunk's
  RoundStats ("t<chunk>.<field>") as host arrays."""
  out = {f"s{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(state))}
  for c, s in enumerate(stats):
    out.update({f"t{c}.{f}": np.asarray(v) for f, v in stats_fields(s).items()})
  return out


def run_golden(name: str, devices: int) -> tuple[dict, dict]:
  """(the three digests, case_values) of `name` run for 2 + 2 rounds on `devices`
  devices."""
  sim, state, stats = run_case(name, devices)
  digests = {"state": state_digest(state), "stats": stats_digest(stats),
             "report": report_digest(sim, state, stats)}
  return digests, case_values(state, stats)


def golden_machine() -> str:
  """What XLA:CPU's bits depend on here: the CPU model and vector extensions, the
  jax and jaxlib versions, XLA's flags (a short key; round_hashes.json keeps the
  long form)."""
  import jaxlib
  model, flags = "", set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
          model = value.strip()
        elif key.strip() == "flags":
          flags |= {x for x in value.split() if x.startswith(("avx", "amx", "fma", "f16c"))}
  except OSError:
    model = os.uname().machine
  return (f"{model} [{' '.join(sorted(flags))}] jax {jax.__version__} jaxlib "
          f"{jaxlib.__version__} XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}")


def machine_key(machine: str) -> str:
  return hashlib.sha256(machine.encode()).hexdigest()[:12]


def value_mismatches(got: dict, want: dict, tol: float = VALUE_TOLERANCE) -> list[str]:
  """The arrays of `got` that differ from `want`: integers and booleans exactly,
  floats by more than `tol` times the largest entry of the recorded array (and
  wherever one is not finite and the other is, or is)."""
  bad = []
  for k in sorted(set(got) | set(want)):
    g, w = got.get(k), want.get(k)
    if g is None or w is None or g.shape != w.shape or g.dtype != w.dtype:
      bad.append(f"{k}: {None if g is None else (g.dtype, g.shape)} vs "
                 f"{None if w is None else (w.dtype, w.shape)}")
    elif not np.issubdtype(w.dtype, np.floating):
      if not np.array_equal(g, w):
        bad.append(f"{k}: differs")
    elif not np.array_equal(np.isfinite(g), np.isfinite(w)) or not np.array_equal(
        g[~np.isfinite(g)], w[~np.isfinite(w)], equal_nan=True):
      bad.append(f"{k}: non-finite entries differ")
    else:
      fin = np.isfinite(w)
      scale = float(np.max(np.abs(w[fin]), initial=0.0))
      err = float(np.max(np.abs(g[fin].astype(np.float64) - w[fin]), initial=0.0))
      if err > tol * scale or (scale == 0.0 and err > 0.0):
        bad.append(f"{k}: off by {err:.3g} (largest entry {scale:.3g})")
  return bad


def _golden() -> dict:
  if not os.path.exists(GOLDEN):
    return {}
  with open(GOLDEN) as f:
    return json.load(f)


def recorded_values(name: str, devices: int) -> dict:
  prefix = f"{name}-{devices}/"
  with np.load(VALUES) as z:
    return {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}


# On 2 devices `make test` runs the configurations whose sharded execution differs
# (resident per-client state, vmapped groups, stacked uploads for a robust rule,
# shuffling, admission, kept noise, Poisson cohorts); `make test-slow` runs the others,
# which take the same sharded paths (test_sharding checks 8 devices against 1 besides).
TWO_DEVICES_IN_MAKE_TEST = {"fedavg", "scaffold_contrastive", "moon_params_fedadmm_vmap",
                            "multi_krum_local_dp", "local_cluster_noise_shuffle",
                            "central_budget_stop", "topksdp_kept_noise",
                            "central_per_layer_poisson"}
CASES = [pytest.param(name, devices, id=f"{name}-{devices}",
                      marks=() if devices == 1 or name in TWO_DEVICES_IN_MAKE_TEST
                      else pytest.mark.slow)
         for name in sorted(CONFIGS) for devices in (1, 2)]


@pytest.mark.parametrize("name, devices", CASES)
def test_round_reproduces_its_golden_results(name, devices):
  got, values = run_golden(name, devices)
  golden = _golden()
  case = f"{name} on {devices} devices"
  want = golden.get("report", {}).get(name, {}).get(str(devices))
  assert want is not None, f"no golden results for {case} (tests/golden/regenerate.py)"
  assert got["report"] == want, f"{case}: the privacy report changed ({want} -> {got['report']})"
  bits = golden.get("machines", {}).get(machine_key(golden_machine()))
  # a machine's bits of a case whose numbers changed since it was recorded are dropped
  # (regenerate.py record keeps the other machines' bits of the cases that did not)
  bits = (bits or {}).get("cases", {}).get(name, {}).get(str(devices))
  if bits is not None:
    want = bits
    changed = [k for k in want if want[k] != got[k]]
    assert not changed, f"{case}: {changed} changed ({want} -> {got}) on {golden_machine()}"
  else:   # the machine string in the warnings summary is what add-machine would record
    warnings.warn(f"golden bits not recorded for {golden_machine()}: values checked within "
                  f"{VALUE_TOLERANCE:g}")
    bad = value_mismatches(values, recorded_values(name, devices))
    assert not bad, f"{case}: {len(bad)} arrays changed: {'; '.join(bad[:6])}"


def test_value_check_catches_a_change_of_one_entry():
  """The values' tolerance is no blanket: one entry of one leaf moved by 1 % of the
  leaf's largest entry, or one integer by one, is a mismatch; the values themselves
  are none."""
  want = recorded_values("fedavg", 1)
  assert want and not value_mismatches(want, want)
  floats = next(k for k in sorted(want) if k.startswith("s") and
                np.issubdtype(want[k].dtype, np.floating) and np.any(want[k]))
  moved = dict(want)
  moved[floats] = want[floats].copy()
  moved[floats].flat[0] += 0.01 * np.max(np.abs(want[floats]))
  assert len(value_mismatches(moved, want)) == 1
  ints = next(k for k in sorted(want) if np.issubdtype(want[k].dtype, np.integer))
  moved = dict(want)
  moved[ints] = want[ints].copy()
  moved[ints].flat[0] += 1
  assert len(value_mismatches(moved, want)) == 1
