"""One epsilon per run: the tightest figure the run computed, labelled with its
accountant, the same in every metrics.jsonl row's round, summary.json and the printed
last line, checked against dp-accounting composing the same rounds; every mode
either has it or says in one field why not."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dp.experiment.reports.local_dp_report import read_client_epsilons

FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
SMALL = ["dataset=digits", "num_clients=100", "clients_per_round=10", "hidden=[32]",
         "batch_size=16", "lr=0.05", "rounds=6", "eval_every=2", "devices=1"]


def run(tmp_path, *sets):
  out = str(tmp_path / "run")
  done = subprocess.run([FEDJAX_DP, "run", "--no-progress", "--out", out, "--set", *SMALL,
                         *sets], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  with open(os.path.join(out, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  return done.stdout.splitlines()[0], rows, summary, out


def dp_accounting_pld(q, z, steps, delta):
  import dp_accounting
  from dp_accounting.pld import pld_privacy_accountant
  acc = pld_privacy_accountant.PLDAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
  return acc.get_epsilon(delta)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_central_pld_rows_summary_and_last_line_show_one_epsilon(tmp_path):
  line, rows, summary, _ = run(tmp_path, "dp=central", "sampling=poisson",
                               "noise_multiplier=1.0", "accountant=pld")
  p = summary["privacy"]
  q = p["q"]   # the rate the sampler draws with (float32 grid)
  for r in rows:   # each row: PLD of the rounds so far, as dp-accounting composes them
    assert r["epsilon_accountant"] == "pld" and r["delta"] == 1e-5
    assert r["epsilon"] == pytest.approx(dp_accounting_pld(q, 1.0, r["round"], 1e-5), rel=1e-12)
  assert p["epsilon"] == rows[-1]["epsilon"] == summary["final"]["epsilon"]
  assert p["epsilon_accountant"] == "pld" and p["epsilon_why_none"] is None
  assert p["rdp_epsilon"] > p["epsilon"] == p["pld_epsilon"]   # the other figure, labelled
  assert line.endswith(f"epsilon {p['epsilon']:.4g} (pld, delta 1e-05)"), line


def test_kept_noise_alone_has_the_per_client_epsilon_at_the_top(tmp_path):
  """dp none with a complete kept-noise mechanism: its per-client figure is the run's."""
  import dp_accounting
  line, rows, summary, out = run(tmp_path, "s_local=0.9", "kept_noise=multiplier",
                                 "kept_noise_multiplier=2.0", "final_clip_l2=1.0",
                                 "index_selection=random_k")
  p = summary["privacy"]
  assert p["epsilon_accountant"] == "rdp, kept noise per client" and p["delta"] == 1e-5
  # replace-one Gaussian with std 2 C_f, sensitivity 2 C_f: multiplier 1, one per round
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(1.0), 6)
  assert p["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
  assert rows[-1]["epsilon"] == p["epsilon"] and rows[-1]["epsilon_accountant"] == \
      p["epsilon_accountant"]
  assert [r["epsilon"] for r in rows] == sorted(r["epsilon"] for r in rows)
  assert line.endswith(f"epsilon {p['epsilon']:.4g} (rdp, kept noise per client, delta "
                       "1e-05)")
  assert os.path.exists(os.path.join(out, "epsilon.png"))


@pytest.mark.parametrize("sets, why", [
    ((), "dp none: no noise is added"),
    (("s_local=0.9", "kept_noise=multiplier", "kept_noise_multiplier=2.0",
      "final_clip_l2=1.0"), "the kept noise has no complete guarantee: data-dependent indices"),
    (("dp=central", "noise_multiplier=0"), "noise_multiplier 0: no noise"),
])
def test_a_run_without_epsilon_says_why_in_one_field(tmp_path, sets, why):
  line, rows, summary, _ = run(tmp_path, *sets)
  p = summary["privacy"]
  assert p["epsilon"] is None and p["epsilon_why_none"].startswith(why), p["epsilon_why_none"]
  assert all(r["epsilon"] is None for r in rows)
  if sets:
    assert line.endswith(f"no epsilon: {p['epsilon_why_none']}")
  else:
    assert "epsilon" not in line


@pytest.mark.slow   # ~12 s: make test-slow, so make test stays under 10 minutes
def test_local_dp_rows_carry_the_largest_clients_figure(tmp_path):
  line, rows, summary, out = run(tmp_path, "dp=local", "noise_multiplier=2.0")
  p = summary["privacy"]
  assert p["epsilon_accountant"] == "rdp" and p["epsilon_is"] == "the largest client's"
  assert rows[-1]["epsilon"] == p["epsilon"] == max(e for e in read_client_epsilons(out) if e)
  assert np.all(np.diff([r["epsilon"] for r in rows]) >= 0)


@pytest.mark.parametrize("q, events, delta", [
    (0.1, [(1.0, 10)], 1e-5), (0.1, [(1.0, 100), (0.8, 20)], 1e-5), (1.0, [(4.0, 25)], 1e-5),
    (1.0, [(2.0, 5), (3.0, 7)], 1e-6), (0.01, [(np.float32(1.1), 300)], 1e-5)])
def test_the_cached_pld_is_dp_accountings_accountant_to_the_float(q, events, delta):
  """planning composes each event's one-step PLD built once (rows compose prefixes of
  the same events); the figure equals PLDAccountant's, float for float."""
  import dp_accounting
  from dp_accounting.pld import pld_privacy_accountant
  from fedjax_dp.privacy import planning
  acc = pld_privacy_accountant.PLDAccountant()
  for z, steps in events:
    event = dp_accounting.GaussianDpEvent(z)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, event) if q < 1 else event, steps)
  assert planning.pld_epsilon_composed(q, events, delta) == acc.get_epsilon(delta)
