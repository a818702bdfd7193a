"""TopkSDP-FL's privacy report: the paper's chain, checked step by step by hand, and
the accountant's figure only when the guarantee is complete."""

import math

import numpy as np
import pytest

from fedjax_dp import amplification, pipeline as pl
from fedjax_dp.config import make_config
from fedjax_dp.topksdp_privacy import topksdp_report

dpa = pytest.importorskip("dp_accounting")

D = 199210


def test_papers_chain_by_hand():
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 3.0,
                     "coordinate_clip": 0.05, "num_clients": 1000, "clients_per_round": 100})
  r = topksdp_report(cfg, D, 200, [60] * 1000)
  k = pl.keep_count(D, 0.9)
  chain = r["papers_chain"]["steps"]
  assert chain[0]["epsilon"] == pytest.approx(3.0 / k) and chain[0]["valid"]
  # 100 reports: no shuffle theorem applies (FMT needs n > 16 ln(2/delta) ~ 195)
  assert not chain[2]["valid"] and "no amplification" in chain[2]["reason"]
  # subsampling by hand, then the best of the compositions
  eps_sub = math.log1p(0.1 * math.expm1(3.0))
  assert chain[3]["epsilon"] == pytest.approx(eps_sub)
  # each report is (3, k delta) = (3, 0.199): sampling keeps a tenth of that delta
  assert chain[3]["delta"] == pytest.approx(0.1 * k * 1e-5)
  # 200 rounds: basic and advanced reach delta 1 (vacuous); the optimal one does not
  sub_delta = 0.1 * k * 1e-5
  assert not chain[4]["alternatives"][0]["valid"] and not chain[4]["alternatives"][1]["valid"]
  want = amplification.compose_optimal(eps_sub, sub_delta, 200, 1e-5)
  assert r["papers_chain"]["epsilon"] == pytest.approx(want.epsilon)
  assert r["papers_chain"]["delta"] == pytest.approx(1 - (1 - sub_delta) ** 200 * (1 - 1e-5))
  # the paper's std, from the largest client (the least noise)
  std = 2 * 0.01 * 0.05 / 60 * math.sqrt(2 * math.log(1.25e5)) * k / 3.0
  assert r["noise_std"]["min_over_clients"] == pytest.approx(std)
  # top-k indices: no guarantee, and it says why
  assert r["accountant"] == {"complete": False, "epsilon": None}
  assert any("data-dependent indices" in x for x in r["not_accounted"])
  assert any("one example in one SGD step" in x for x in r["not_accounted"])


def test_papers_chain_claims_no_shuffling_when_the_run_does_not_shuffle():
  # 1,000 reports a round with eps0 = 1 and k = 20 (200 parameters): FMT 2021 Thm 3.8
  # applies, but only if the run shuffles
  base = {"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 1.0,
          "coordinate_clip": 0.05, "num_clients": 10000, "clients_per_round": 1000}
  shuffled = topksdp_report(make_config(base), 200, 10, [60] * 10000)["papers_chain"]["steps"][2]
  fmt = amplification.shuffle_fmt(1.0, 1000, 1e-5, delta0=20e-5)
  assert fmt.valid and fmt.epsilon < 1.0
  assert shuffled["valid"] and shuffled["epsilon"] == pytest.approx(fmt.epsilon)
  assert shuffled["delta"] == pytest.approx(fmt.delta)
  chain = topksdp_report(make_config(dict(base, shuffle="none")), 200, 10,
                         [60] * 10000)["papers_chain"]["steps"]
  assert not chain[2]["valid"] and "does not shuffle" in chain[2]["reason"]
  assert (chain[2]["epsilon"], chain[2]["delta"]) == (1.0, pytest.approx(20e-5))
  assert chain[3]["epsilon"] == pytest.approx(math.log1p(0.1 * math.expm1(1.0)))
  assert chain[3]["delta"] == pytest.approx(0.1 * 20e-5)


def _chain(d, rounds, **over):
  cfg = make_config(dict({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 1.0,
                          "coordinate_clip": 0.05}, **over))
  return topksdp_report(cfg, d, rounds, [72] * cfg.num_clients)["papers_chain"]


def test_papers_chain_charges_k_delta_per_report():
  """Found by an audit: k coordinates at (eps / k, delta) compose to (eps, k delta), not
  (eps, delta). N = 20, m = 5, k = 121 (1,210 parameters at s_local 0.9), 4 rounds:
  reported (1.43, 1e-5), while the client's report alone is (1, 1.21e-3)."""
  chain = _chain(1210, 4, num_clients=20, clients_per_round=5)
  client = chain["steps"][1]
  assert client["valid"] and client["epsilon"] == pytest.approx(1.0)
  assert client["delta"] == pytest.approx(121e-5)
  # independent check of that step: dp-accounting's PLD of 121 (1/121, 1e-5)-DP
  # mechanisms has delta(eps = 1) = 1 - (1 - 1e-5)^121 ~ 1.209e-3 (just under k delta),
  # and no finite epsilon at the paper's delta of 1e-5
  from dp_accounting.pld import common, privacy_loss_distribution as pld
  composed = pld.from_privacy_parameters(
      common.DifferentialPrivacyParameters(1.0 / 121, 1e-5)).self_compose(121)
  assert composed.get_delta_for_epsilon(1.0) == pytest.approx(1 - (1 - 1e-5) ** 121, rel=1e-6)
  assert composed.get_delta_for_epsilon(1.0) <= client["delta"]
  assert composed.get_epsilon_for_delta(1e-5) == math.inf
  # 5 reports: no shuffle theorem, the report's own delta goes on; sampling 1/4; 4 rounds
  assert not chain["steps"][2]["valid"] and chain["steps"][2]["delta"] == pytest.approx(121e-5)
  assert chain["steps"][3]["delta"] == pytest.approx(0.25 * 121e-5)
  assert chain["epsilon"] == pytest.approx(4 * math.log1p(0.25 * math.expm1(1.0)))
  assert chain["delta"] >= 121e-5 and not chain["vacuous"]


@pytest.mark.parametrize("d,m", [(1210, 1000), (200, 5000)])   # k = 121 and k = 20
def test_papers_chain_shuffle_step_is_vacuous_for_gaussian_reports(d, m):
  """Found by an audit: 1,000 reports with k = 121 or 5,000 with k = 20: FMT 2021
  Thm 3.8 charges at least 2 n k delta (> 1) for the reports' delta; the chain gave
  delta 1e-4. The shuffle step is invalid (vacuous), no amplification is claimed,
  and the chain goes on from the client's own (eps, k delta)."""
  for sampling in ("fixed", "poisson"):
    chain = _chain(d, 90, num_clients=10 * m, clients_per_round=m, sampling=sampling)
    k = pl.keep_count(d, 0.9)
    shuffled = chain["steps"][2]
    assert not shuffled["valid"] and "vacuous" in shuffled["reason"]
    by_hand = 1e-5 + (math.exp(amplification.shuffle_fmt(1.0, m, 1e-5).epsilon) + 1) * (
        1 + math.exp(-1.0) / 2) * m * k * 1e-5
    assert by_hand > 1
    assert (shuffled["epsilon"], shuffled["delta"]) == (1.0, pytest.approx(k * 1e-5))
    assert chain["epsilon"] > 4 and chain["delta"] >= 1 - (1 - 0.1 * k * 1e-5) ** 90
  assert "Poisson cohort" in shuffled["reason"] and "random size" in shuffled["step"]


def test_papers_chain_says_vacuous_when_no_composition_has_delta_below_one():
  # k = 2,000 coordinates at delta 1e-3: each report's k delta is 2 (1 at most); all
  # clients every round, so no step brings delta below 1
  chain = _chain(20000, 50, num_clients=20, clients_per_round=20, ldp_delta=1e-3)
  assert not chain["steps"][1]["valid"] and "vacuous" in chain["steps"][1]["reason"]
  assert chain["vacuous"] and chain["epsilon"] is None and "vacuous" in chain["label"]
  assert not chain["steps"][-1]["valid"] and chain["delta"] >= 1


@pytest.mark.parametrize("selection", ["random_k", "public_topk"])
def test_complete_guarantee_with_public_indices_and_final_clip(selection):
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "multiplier",
                     "kept_noise_multiplier": 4.0, "final_clip_l2": 0.5,
                     "index_selection": selection})
  r = topksdp_report(cfg, D, 50, [60] * 20)
  acc = r["accountant"]
  assert acc["complete"] and acc["noise_multiplier"] == pytest.approx(2.0)  # std 2.0 / (2 * 0.5)
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  oracle.compose(dpa.GaussianDpEvent(2.0), 50)
  assert acc["epsilon"] == pytest.approx(oracle.get_epsilon(1e-5), rel=1e-3)
  assert r["not_accounted"] == []


def test_complete_guarantee_follows_the_learning_rate_schedule():
  """Found by an audit: the paper's calibration scales the noise with each round's
  learning rate, but the report charged every round at round 0's, understating
  epsilon about 5x for 4 cosine rounds (4.66 against 22.5). Each round at its own
  noise against dp-accounting."""
  import math as m
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 1.0,
                     "coordinate_clip": 0.05, "final_clip_l2": 1.0, "index_selection": "random_k",
                     "lr": 0.1, "lr_schedule": "cosine", "lr_min": 0.0, "rounds": 4})
  r = topksdp_report(cfg, D, 4, [60] * 20)
  acc = r["accountant"]
  scale = [0.5 * (1 + m.cos(m.pi * t / 4)) for t in range(4)]   # optax cosine, alpha 0
  k = pl.keep_count(D, 0.9)
  z0 = 2 * 0.1 * 1.0 / 60 * m.sqrt(2 * m.log(1.25 / 1e-5)) * k / 1.0 / (2 * 1.0)
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  for s in scale:
    oracle.compose(dpa.GaussianDpEvent(z0 * s))
  assert acc["epsilon"] == pytest.approx(oracle.get_epsilon(1e-5), rel=1e-3)
  assert acc["noise_multiplier"] == pytest.approx(z0 * min(scale), rel=1e-5)
  assert r["noise_std"]["over_rounds"] == "with the learning rate (cosine)"
  constant = topksdp_report(make_config(dict(cfg.to_dict(), lr_schedule="constant")), D, 4,
                            [60] * 20)["accountant"]["epsilon"]
  assert acc["epsilon"] > 2 * constant


def test_final_clip_bounds_the_sent_norm_and_conserves_mass():
  rng = np.random.default_rng(0)
  stage = pl.topk_with_error_feedback(0.5, "random_k", final_clip=0.1)
  import jax
  import jax.numpy as jnp
  u = rng.normal(size=200)
  residual = jnp.asarray(rng.normal(size=200) * 10, jnp.float32)
  ctx = pl.StageContext(jax.random.PRNGKey(0), jnp.int32(10), jnp.float32(0.1), jnp.zeros(200))
  out, new_r = stage.update(pl.Upload(jnp.asarray(u, jnp.float32), jnp.ones(200, bool)),
                            residual, ctx)
  assert float(jnp.linalg.norm(out.values)) <= 0.1 + 1e-6
  np.testing.assert_allclose(np.asarray(out.values + new_r), np.asarray(u + residual), rtol=1e-6)


def test_run_writes_the_report(tmp_path):
  import json
  import os
  from fedjax_dp.cli import main
  out = str(tmp_path / "r")
  sets = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
          "batch_size=16", "lr=0.05", "rounds=10", "eval_every=5", "devices=1",
          "algorithm=topksdp", "kept_noise=multiplier", "kept_noise_multiplier=2.0",
          "final_clip_l2=0.5", "index_selection=random_k"]
  assert main(["run", "--no-progress", "--out", out] + sum([["--set", s] for s in sets], [])) == 0
  p = json.load(open(os.path.join(out, "summary.json")))["privacy"]
  assert p["dp"] == "none" and p["kept_noise"]["accountant"]["complete"]
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  oracle.compose(dpa.GaussianDpEvent(1.0), 10)
  assert p["kept_noise"]["accountant"]["epsilon"] == pytest.approx(oracle.get_epsilon(1e-5),
                                                                   rel=1e-3)
