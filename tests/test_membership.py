"""Membership inference (adversary/membership.py, `fedjax-dp attack mia`): the ROC
figures against scikit-learn, the balanced sets, the DP bound, and the attack on
an overfit model with and without DP."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

import fedjax_dp
from fedjax_dp.adversary import membership


@pytest.mark.parametrize("ties", [False, True])
def test_roc_figures_agree_with_scikit_learn(ties):
  rng = np.random.default_rng(3)
  a, b = rng.normal(0.6, 1, 400), rng.normal(0, 1, 300)
  if ties:     # a perfectly fit model's losses: many exact zeros on both sides
    a[:120], b[:40] = 0.0, 0.0
    a, b = np.round(a, 1), np.round(b, 1)
  got = membership.roc_figures(a, b)
  y, s = np.r_[np.ones(len(a)), np.zeros(len(b))], np.r_[a, b]
  fpr, tpr, _ = roc_curve(y, s)
  assert got["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
  assert got["tpr_at_1pct_fpr"] == pytest.approx(tpr[fpr <= 0.01].max(), abs=1e-12)
  assert got["accuracy"] == pytest.approx(np.max((tpr + 1 - fpr) / 2), abs=1e-12)


def test_chance_and_perfect_separation():
  assert membership.roc_figures(np.ones(10), np.ones(10)) == {
      "accuracy": 0.5, "auc": 0.5, "tpr_at_1pct_fpr": 0.0}
  assert membership.roc_figures(np.arange(10) + 10.0, np.arange(10)) == {
      "accuracy": 1.0, "auc": 1.0, "tpr_at_1pct_fpr": 1.0}


def test_balanced_sets_and_the_dp_bound():
  mem, non = membership.balanced_sets(1000, 300, None, seed=1)
  assert len(mem) == len(non) == 300 and len(set(mem)) == 300 and mem.max() < 1000
  mem2, _ = membership.balanced_sets(1000, 300, 50, seed=1)
  assert len(mem2) == 50
  assert membership.dp_tpr_bound(1.0, 1e-5) == pytest.approx(math.e * 0.01 + 1e-5)
  assert membership.dp_tpr_bound(10.0, 1e-5) == 1.0
  assert membership.dp_tpr_bound(None, None) is None
  # Poisson sampling's add/remove of whole clients: an example is two steps away
  assert membership.dp_tpr_bound(1.0, 1e-5, steps=2) == pytest.approx(
      math.e ** 2 * 0.01 + (1 + math.e) * 1e-5)
  assert membership.membership_steps("add/remove one client (Poisson sampling; ...)") == 2
  assert membership.membership_steps("replace one client (fixed-size cohorts; ...)") == 1
  assert membership.membership_steps(None) == 1


def test_example_losses_are_each_examples_cross_entropy():
  w = {"w": np.array([[1.0, -1.0, 0.0], [0.5, 0.5, 2.0]], np.float32)}
  apply = lambda p, x: x @ p["w"]
  x = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], np.float32)
  y = np.array([0, 2, 1], np.int32)
  logits = x @ w["w"]
  want = -(logits[np.arange(3), y] - np.log(np.exp(logits).sum(1)))
  np.testing.assert_allclose(membership.example_losses(apply, w, x, y, batch=2), want,
                             rtol=1e-6)


def test_attack_features_are_loss_confidence_and_entropy():
  w = {"w": np.array([[1.0, -1.0, 0.0], [0.5, 0.5, 2.0]], np.float32)}
  apply = lambda p, x: x @ p["w"]
  x = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], np.float32)
  y = np.array([0, 2, 1], np.int32)
  logits = (x @ w["w"]).astype(np.float64)
  p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  want = np.stack([-np.log(p[np.arange(3), y]), p.max(1), -(p * np.log(p)).sum(1)], 1)
  np.testing.assert_allclose(membership.attack_features(apply, w, x, y), want, rtol=1e-5)


def test_shadow_epochs_visit_each_example_as_the_run_did():
  from fedjax_dp import make_config
  from fedjax_dp.experiment.attack import shadow_epochs
  assert shadow_epochs(make_config({"rounds": 20, "num_clients": 10, "clients_per_round": 5,
                                    "local_epochs": 2})) == 20
  assert shadow_epochs(make_config({"rounds": 500, "local_epochs": 2})) == 100
  assert shadow_epochs(make_config({"rounds": 1, "num_clients": 100,
                                    "clients_per_round": 1})) == 1


OVERFIT = dict(dataset="synthetic", synthetic_examples=600, synthetic_features=100,
               synthetic_classes=10, num_clients=4, clients_per_round=4, local_epochs=10,
               rounds=20, eval_every=20, hidden=[256, 256], lr=0.1)


@pytest.mark.slow
def test_the_attack_beats_chance_on_an_overfit_model_and_dp_brings_it_down(tmp_path):
  """Measured: attack accuracy 0.91 (AUC 0.91) without DP; with central DP
  (z = 1, C = 1) the model learns little and the attack is near chance."""
  out = {}
  for name, extra in (("plain", {}), ("dp", {"dp": "central", "noise_multiplier": 1.0,
                                           "clip_norm": 1.0})):
    fedjax_dp.run({**OVERFIT, **extra}, out=str(tmp_path / name), progress=False,
                  log=lambda m: None)
    out[name] = fedjax_dp.attack_mia(str(tmp_path / name), shadows=2)
  assert out["plain"]["accuracy"] > 0.8 and out["plain"]["auc"] > 0.8
  # the shadow models' attack, whose threshold never saw the target's membership
  # (measured 0.87 with 4 shadows): near the oracle threshold's, and down under DP
  shadow = out["plain"]["shadow"]
  assert shadow["accuracy_at_attack_threshold"] > 0.75 and shadow["auc"] > 0.8
  assert out["dp"]["shadow"]["auc"] < shadow["auc"] - 0.2
  assert out["dp"]["accuracy"] < out["plain"]["accuracy"] - 0.2
  assert out["dp"]["epsilon"] is not None and out["plain"]["epsilon"] is None
  assert out["dp"]["tpr_at_1pct_fpr"] <= out["dp"]["dp_bound_tpr_at_1pct_fpr"]


def cli(*args):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, "attack", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow   # ~22 s: make test-slow, so make test stays under 10 minutes
def test_cli_attacks_a_run_and_refuses_bad_input(tmp_path):
  run = tmp_path / "run"
  fedjax_dp.run({**OVERFIT, "rounds": 2, "eval_every": 2, "local_epochs": 1}, out=str(run),
                progress=False, log=lambda m: None)
  done = cli("mia", "--run", str(run), "--examples", "50", "--json", str(tmp_path / "m.json"))
  assert done.returncode == 0, done.stderr
  assert "membership inference, loss threshold: 50 members (train)" in done.stdout
  with open(tmp_path / "m.json") as f:
    report = json.load(f)
  assert report == fedjax_dp.attack_mia(str(run), examples=50) | {"run": report["run"]}
  again = cli("mia", "--run", str(run), "--json", str(tmp_path / "m.json"))
  assert again.returncode == 2 and again.stderr.strip().endswith(
      "the file exists; name a new one")
  negative = cli("mia", "--run", str(run), "--shadows", "-1")
  assert negative.returncode == 2 and "allowed are whole numbers >= 0" in negative.stderr
  missing = cli("mia", "--run", str(tmp_path / "nope"))
  assert missing.returncode == 2 and "no such folder" in missing.stderr


def test_the_bound_takes_a_guarantee_that_covers_adding_or_removing_an_example():
  """Found by an audit: under `kept_noise: paper` (dp none) the bound used the kept
  noise's epsilon, which holds only for neighbours of the same size n_i, and an
  example's membership changes n_i. User-level DP covers any change of a client's
  data; kept noise only where the server weights the uploads uniformly (a shuffle,
  not FedAvg's n_i): multiplier's epsilon, and for paper the size_leak epsilon of
  sizes one example apart."""
  from fedjax_dp import make_config
  from fedjax_dp.experiment.attack import membership_privacy
  poisson = "add/remove one client (Poisson sampling; sensitivity clip_norm)"
  central = {"epsilon": 2.0, "delta": 1e-5, "neighbouring": poisson,
             "epsilon_accountant": "pld"}
  g = membership_privacy(make_config({"dp": "central", "noise_multiplier": 1.0,
                                      "sampling": "poisson"}), central, 1)
  assert g == {**central, "why_none": None}
  local = {**central, "neighbouring": "replace one client's data (sensitivity 2 clip_norm)"}
  assert membership_privacy(make_config({"dp": "local", "noise_multiplier": 1.0}), local,
                            1) == {**local, "why_none": None}
  none = {"epsilon": None, "epsilon_why_none": "dp none: no noise is added, so ..."}
  assert membership_privacy(make_config({}), none, 5)["why_none"] == none["epsilon_why_none"]
  kept = {"s_local": 0.5, "index_selection": "random_k", "final_clip_l2": 0.5}
  leak = {"epsilon": 9.5, "delta": 1e-5, "mean_shift": 1.0, "n": 4, "vs": 5}
  report = {"epsilon": 3.0, "delta": 1e-5, "epsilon_accountant": "rdp, kept noise per client",
            "kept_noise": {"size_leak": leak}}
  paper = {**kept, "kept_noise": "paper", "ldp_epsilon": 5.0}
  flat = {**kept, "kept_noise": "multiplier", "kept_noise_multiplier": 2.0}
  for keys in (paper, flat):   # FedAvg weights each upload by n_i, outside the noise
    g = membership_privacy(make_config(keys), report, 5)
    assert g["epsilon"] is None and "weights them by the client's example count n_i" in (
        g["why_none"])
  g = membership_privacy(make_config({**flat, "shuffle": "layerwise"}), report, 5)
  assert (g["epsilon"], g["epsilon_accountant"]) == (3.0, report["epsilon_accountant"])
  shuffled = make_config({**paper, "shuffle": "layerwise"})
  g = membership_privacy(shuffled, report, 5)
  assert (g["epsilon"], g["delta"], g["why_none"]) == (9.5, 1e-5, None)
  assert g["epsilon_accountant"].endswith("add or remove one example (size_leak)")
  g = membership_privacy(shuffled, report, 1)   # a client left with no example
  assert g["epsilon"] is None and "holds only for clients of the same size n_i" in g["why_none"]
  g = membership_privacy(shuffled, {**report, "kept_noise": {}}, 5)
  assert g["epsilon"] is None and "no finite size_leak epsilon" in g["why_none"]


KEPT_PAPER = dict(dataset="synthetic", synthetic_examples=400, num_clients=20,
                  clients_per_round=10, rounds=1, eval_every=1, hidden=[8], s_local=0.5,
                  index_selection="random_k", final_clip_l2=0.5, kept_noise="paper",
                  ldp_epsilon=5.0)


def test_a_kept_noise_paper_run_gets_no_bound_and_says_why(tmp_path):
  """The run's report gives the kept noise's epsilon ("rdp, kept noise per client",
  same n_i only); unshuffled, the attack's report gives no bound, and why."""
  from fedjax_dp.experiment.attack import format_report
  fedjax_dp.run(KEPT_PAPER, out=str(tmp_path / "k"), progress=False, log=lambda m: None)
  with open(tmp_path / "k" / "summary.json") as f:
    assert json.load(f)["privacy"]["epsilon"] > 0
  report = fedjax_dp.attack_mia(str(tmp_path / "k"), examples=50)
  assert report["dp_bound_tpr_at_1pct_fpr"] is None and report["epsilon"] is None
  assert "the server weights them by the client's example count n_i" in (
      report["dp_bound_why_none"])
  assert f"(no DP bound: {report['dp_bound_why_none']})" in format_report(report)


@pytest.mark.slow   # ~10 s: two runs
def test_a_shuffled_kept_noise_paper_run_takes_its_size_leak_and_central_dp_its_epsilon(
    tmp_path):
  """Shuffled (uniform weights), the paper's kept noise is bounded by the report's
  size_leak epsilon; a central-DP run (fixed cohorts: replace one client) by its own."""
  quiet = dict(progress=False, log=lambda m: None)
  fedjax_dp.run({**KEPT_PAPER, "shuffle": "layerwise"}, out=str(tmp_path / "s"), **quiet)
  with open(tmp_path / "s" / "summary.json") as f:
    leak = json.load(f)["privacy"]["kept_noise"]["size_leak"]
  report = fedjax_dp.attack_mia(str(tmp_path / "s"), examples=50)
  assert report["epsilon"] == leak["epsilon"] and report["dp_bound_why_none"] is None
  assert report["dp_bound_tpr_at_1pct_fpr"] == membership.dp_tpr_bound(leak["epsilon"], 1e-5)
  central = {k: KEPT_PAPER[k] for k in ("dataset", "synthetic_examples", "num_clients",
                                         "clients_per_round", "rounds", "eval_every", "hidden")}
  fedjax_dp.run({**central, "dp": "central", "noise_multiplier": 3.0},
                out=str(tmp_path / "c"), **quiet)
  with open(tmp_path / "c" / "summary.json") as f:
    eps = json.load(f)["privacy"]["epsilon"]
  report = fedjax_dp.attack_mia(str(tmp_path / "c"), examples=50)
  assert report["epsilon"] == eps and report["dp_bound_steps"] == 1
  assert report["dp_bound_tpr_at_1pct_fpr"] == membership.dp_tpr_bound(eps, 1e-5)
