"""Golden results: the refactors of the round (issue 19) keep every number bit for bit.

For each configuration below (together they cover every feature of the round)
the test runs four rounds as two compiled chunks on 1 and on 2 devices and
compares SHA-256 digests of
  state   every leaf of the final SimState (client order),
  stats   every RoundStats field of every round,
  report  the privacy report composed from the run's privacy log (sorted JSON),
against tests/golden/round_hashes.json. A change that alters numbers on purpose
says so in its commit and regenerates the file in that commit only:

  FEDJAX_DP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q -m "slow or not slow" tests/test_golden.py

The state and stats digests are the XLA:CPU bits of an x86 machine with AVX-512
(CI's kind, and an Intel Xeon's with jax 0.11.2 alike); an AMD EPYC without
AVX-512 computes other bits for every case (measured 2026-11-27: all 52 differ,
with or without --xla_cpu_max_isa=AVX2). On such a machine this test fails for
every case; regenerate the file from states computed on a machine of the
recorded kind with tests/golden/regenerate.py (its docstring).

(`make test` runs every configuration on 1 device and a third of them on 2; see
TWO_DEVICES_IN_MAKE_TEST. Run all of them with `make test-slow` before and after
moving code.)
"""

import hashlib
import json
import os

import jax
import numpy as np
import pytest

from fedjax_dp.privacy import privacy_log
from fedjax_dp.privacy.privacy_report import privacy_report
from fedjax_dp.core.simulation import build_simulation
from fedjax_dp.data.tabular import TIERS
from tests.helpers import toy_problem, toy_simulation

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "round_hashes.json")
# the hashes are XLA:CPU's bits; another backend's kernels sum in other orders
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="golden hashes are recorded on CPU")
UPDATE = os.environ.get("FEDJAX_DP_UPDATE_GOLDEN") == "1"
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


def stats_digest(stats) -> str:
  return _digest(np.asarray(getattr(s, f)).tobytes() for s in stats for f in s._fields)


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
    sim = build_simulation(sim.cfg, sim.model, sim.store, sim.mesh, client_budgets=BUDGETS[name])
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


def run_golden(name: str, devices: int) -> dict:
  """The three digests of `name` run for 2 + 2 rounds on `devices` devices."""
  sim, state, stats = run_case(name, devices)
  return {"state": state_digest(state), "stats": stats_digest(stats),
          "report": report_digest(sim, state, stats)}


def _golden() -> dict:
  if not os.path.exists(GOLDEN):
    return {}
  with open(GOLDEN) as f:
    return json.load(f)


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
def test_round_reproduces_its_golden_hashes(name, devices):
  got = run_golden(name, devices)
  if UPDATE:
    golden = _golden()
    golden.setdefault(name, {})[str(devices)] = got
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    tmp = GOLDEN + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(golden, f, indent=1, sort_keys=True)
    os.replace(tmp, GOLDEN)
    return
  want = _golden().get(name, {}).get(str(devices))
  assert want is not None, f"no golden hashes for {name} on {devices} devices"
  changed = [k for k in want if want[k] != got[k]]
  assert not changed, f"{name} on {devices} devices: {changed} changed ({want} -> {got})"
