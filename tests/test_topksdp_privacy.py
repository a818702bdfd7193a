"""TopkSDP-FL's privacy report: the paper's chain, checked step by step by hand, and
the accountant's figure only when the guarantee is complete."""

import math

import numpy as np
import pytest

from fedjax_dp.privacy import amplification

from fedjax_dp.compression import pipeline as pl
from fedjax_dp import make_config
from fedjax_dp.experiment.reports.topksdp_privacy import gaussian_pair_rdp, topksdp_report

dpa = pytest.importorskip("dp_accounting")

D = 199210


def test_papers_chain_by_hand():
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 3.0,
                     "coordinate_clip": 0.05, "num_clients": 1000, "clients_per_round": 100,
                     "lr": 0.01})
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


@pytest.mark.parametrize("s1,s2,shift,a", [(1.0, 0.9, 0.5, 2.0), (0.9, 1.0, 0.5, 3.5),
                                           (1 / 72, 1 / 73, 0.0, 4.1), (1 / 73, 1 / 72, 0.01, 20.0),
                                           (2.0, 2.0, 1.0, 1.5)])
def test_gaussian_pair_rdp_is_the_numerical_integral(s1, s2, shift, a):
  """The closed form of D_a(N(shift, s1^2) || N(0, s2^2)) against ln(int p^a q^(1-a)) / (a - 1)
  by quadrature, and d coordinates as the sum of d univariate divergences."""
  from scipy import integrate, stats
  def divergence(sh):
    f = lambda x: math.exp(a * stats.norm.logpdf(x, sh, s1) + (1 - a) * stats.norm.logpdf(x, 0, s2))
    lo, hi = -12 * max(s1, s2) - abs(sh), 12 * max(s1, s2) + abs(sh)
    return math.log(integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-11, limit=200)[0]) / (a - 1)
  closed = gaussian_pair_rdp(s1, s2, 1, shift, orders=[a])[0]
  assert closed == pytest.approx(divergence(shift), rel=1e-6, abs=1e-12)
  three = gaussian_pair_rdp(s1, s2, 3, shift, orders=[a])[0]
  assert three == pytest.approx(divergence(shift) + 2 * divergence(0.0), rel=1e-6, abs=1e-12)


def test_gaussian_pair_rdp_is_infinite_past_the_variance_limit():
  # s1 = 1 > s2 = 0.5: finite only for a < s1^2 / (s1^2 - s2^2) = 4/3
  d = gaussian_pair_rdp(1.0, 0.5, 1, 0.0, orders=[1.2, 1.5, 2.0])
  assert math.isfinite(d[0]) and np.isinf(d[1:]).all()


def test_paper_noise_reveals_the_client_size():
  """Found by an audit: `kept_noise: paper` sets the std to 2 lr C factor / n_i, so the
  noise level itself tells n from n + 1. With k = 121 over 40 rounds and the std of a
  client of 72 examples at noise multiplier z (std / (2 C_f)) whose fixed-sigma epsilon
  is 0.60, the pair 72 vs 73 is 7.08 (the audit's figures); the report gives the worst
  neighbour pair, removing an example from the smallest client (71 vs 72), and says
  the accountant's figure holds only for neighbours with the same n_i."""
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 0.01,
                     "lr": 0.05, "final_clip_l2": 0.5, "index_selection": "random_k",
                     "num_clients": 20, "clients_per_round": 5, "rounds": 40})
  k = pl.keep_count(1210, 0.9)
  assert k == 121
  r = topksdp_report(cfg, 1210, 40, [72] * 20)
  factor = math.sqrt(2 * math.log(1.25e5)) * k / 0.01
  std = lambda n: 2 * 0.05 * 0.5 * factor / n
  z72 = std(72) / (2 * 0.5)
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  oracle.compose(dpa.GaussianDpEvent(z72), 40)
  fixed = oracle.get_epsilon(1e-5)
  assert fixed == pytest.approx(0.60, abs=0.01)
  assert r["accountant"]["epsilon"] == pytest.approx(fixed, rel=1e-3)   # all clients of 72
  from fedjax_dp.privacy import accounting
  def pair(n1, n2):
    both = [40 * (gaussian_pair_rdp(std(a), std(b), k, 0.0)
                  + gaussian_pair_rdp(std(a), std(b), 0, 1.0)) for a, b in ((n1, n2), (n2, n1))]
    return max(accounting.epsilon_np(x, 1e-5)[0] for x in both)
  assert pair(72, 73) == pytest.approx(7.08, abs=0.01)
  leak = r["size_leak"]
  assert (leak["n"], leak["vs"]) == (71, 72) and leak["epsilon"] == pytest.approx(pair(71, 72))
  assert leak["epsilon"] > pair(72, 73) > 10 * fixed
  assert leak["epsilon_std_fixed"] == pytest.approx(fixed, rel=1e-3)
  assert "same number of examples n_i" in r["accountant"]["guarantee"]
  text = [x for x in r["not_accounted"] if "reveals n_i" in x]
  assert len(text) == 1 and "re-links a client's layers" in text[0] and "7.19" in text[0]
  # the multiplier's std does not depend on n_i: nothing to list
  flat = topksdp_report(make_config({"algorithm": "topksdp", "kept_noise": "multiplier",
                                     "kept_noise_multiplier": 4.0, "final_clip_l2": 0.5,
                                     "index_selection": "random_k"}), 1210, 40, [72] * 20)
  assert "size_leak" not in flat and flat["not_accounted"] == []


def test_recorded_learning_rates_set_each_rounds_noise():
  """Found by an audit: after `--resume --set rounds=40` under a cosine schedule the
  report recomputed every round's noise from the new schedule, though rounds 0-19 ran
  on the 20-round one. With round_lrs (as run) each round is a Gaussian at its own
  noise, against dp-accounting's RDP composition."""
  import math as m
  cfg = make_config({"algorithm": "topksdp", "kept_noise": "paper", "ldp_epsilon": 1.0,
                     "coordinate_clip": 0.05, "final_clip_l2": 1.0, "index_selection": "random_k",
                     "lr": 0.1, "lr_schedule": "cosine", "lr_min": 0.0, "rounds": 40})
  cos = lambda t, T: 0.1 * 0.5 * (1 + m.cos(m.pi * t / T))
  lrs = [cos(t, 20) for t in range(20)] + [cos(t, 40) for t in range(20, 40)]
  r = topksdp_report(cfg, D, 40, [60] * 20, round_lrs=lrs)
  k = pl.keep_count(D, 0.9)
  z0 = 2 * 0.1 * 1.0 / 60 * m.sqrt(2 * m.log(1.25 / 1e-5)) * k / 1.0 / (2 * 1.0)
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  for lr in lrs:
    oracle.compose(dpa.GaussianDpEvent(z0 * lr / 0.1))
  assert r["accountant"]["epsilon"] == pytest.approx(oracle.get_epsilon(1e-5), rel=1e-3)
  assert r["noise_std"]["over_rounds"] == "with the learning rate (as recorded by the rounds)"
  recomputed = topksdp_report(cfg, D, 40, [60] * 20)["accountant"]["epsilon"]
  assert recomputed < r["accountant"]["epsilon"] * 0.99   # the new schedule's noise is larger
  with pytest.raises(ValueError, match="round_lrs has 39 entries"):
    topksdp_report(cfg, D, 40, [60] * 20, round_lrs=lrs[:39])


def test_final_clip_bounds_the_sent_norm_and_conserves_mass():
  rng = np.random.default_rng(0)
  stage = pl.topk_with_error_feedback(0.5, "random_k", final_clip=0.1)
  import jax
  import jax.numpy as jnp
  u = rng.normal(size=200)
  residual = jnp.asarray(rng.normal(size=200) * 10, jnp.float32)
  ctx = pl.StageContext(jax.random.PRNGKey(0), jnp.int32(10), jnp.float32(0.1), jnp.zeros(200))
  out, new_r, _ = stage.update(pl.Upload(jnp.asarray(u, jnp.float32), jnp.ones(200, bool)),
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
