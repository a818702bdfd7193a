"""`fedjax-dp account --config F [--set ...]` (issue 41, finding 6 of the first-hour
review): a run config's q, rounds, neighbouring relation, noise multiplier and epsilon
as the run is charged, before running it. Checked against the runs themselves (their
summary.json's epsilon and rounds) and against dp-accounting composing the same events."""

import json
import os
import subprocess
import sys

import dp_accounting
import pytest

import fedjax_dp
from fedjax_dp import make_config
from fedjax_dp.experiment import plan_privacy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")   # the console script
SMALL = {"dataset": "digits", "hidden": [16], "batch_size": 32, "eval_every": 5, "seed": 0}


def account(*args):
  return subprocess.run([FEDJAX_DP, "account", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)


@pytest.mark.parametrize("values", [
    # Poisson cohorts, calibrated to a target, the PLD figure reported (it is smaller)
    {"num_clients": 60, "clients_per_round": 20, "sampling": "poisson", "dp": "central",
     "target_epsilon": 3.0, "rounds": 10, "accountant": "pld"},
    # fixed cohorts (replace one), a configured multiplier the budget stops after some rounds
    {"num_clients": 40, "clients_per_round": 10, "sampling": "fixed", "dp": "central",
     "noise_multiplier": 4.0, "target_epsilon": 4.0, "rounds": 40},
    # local DP, everyone every round: the largest client's epsilon is the every-round one
    {"num_clients": 20, "clients_per_round": 20, "sampling": "fixed", "dp": "local",
     "noise_multiplier": 3.0, "target_epsilon": 10.0, "rounds": 12},
    # many rounds: the in-round float32 ledger rounds up each one (2e-4 above float64
    # composition at 10,000): the plan composes as the ledger does, never below it
    {"num_clients": 40, "clients_per_round": 10, "sampling": "poisson", "dp": "central",
     "noise_multiplier": 15.0, "rounds": 3000, "eval_every": 1500},
    # local DP at a budget's edge: the run refuses the participation that passes
    # target_epsilon (1 - 1e-5), in float32, in the round
    {"num_clients": 40, "clients_per_round": 40, "sampling": "poisson", "dp": "local",
     "noise_multiplier": 2.0, "target_epsilon": 8.074426, "delta": 1e-4, "rounds": 10},
    # local DP under PLD: the most frequent client's participations
    {"num_clients": 40, "clients_per_round": 40, "sampling": "poisson", "dp": "local",
     "noise_multiplier": 4.0, "accountant": "pld", "delta": 1e-4, "rounds": 10},
], ids=["central-poisson-pld", "central-fixed-budget", "local-every-round",
        "central-many-rounds", "local-budget-edge", "local-pld"])
def test_the_plan_is_what_the_run_reports(values, tmp_path):
  cfg = make_config({**SMALL, **values})
  planned = plan_privacy.plan(cfg)
  summary = fedjax_dp.run(cfg, out=str(tmp_path / "run"), progress=False)
  privacy = summary["privacy"]
  # composed as the run's float32 ledger composes it: the same figure, not a float64 one
  assert planned["epsilon"] == pytest.approx(privacy["epsilon"], rel=1e-12, abs=0)
  assert planned["epsilon_accountant"] == privacy["epsilon_accountant"]
  assert planned["noise_multiplier"] == pytest.approx(privacy["noise_multiplier"], rel=1e-9)
  assert planned["neighbouring"] == privacy["neighbouring"]
  if values["dp"] == "central":   # the rounds the budget let the run release
    skipped = privacy.get("rounds_skipped_by_budget", 0)
    assert planned["rounds_charged"] == summary["rounds"] - skipped
  if values["sampling"] == "fixed" and values["dp"] == "central":
    assert planned["rounds_charged"] < cfg.rounds   # the case is the budget's
  if values["dp"] == "local":   # everyone every round: the most frequent client's count
    assert planned["rounds_charged"] == privacy["clients"]["participations"]["max"]


def test_the_plan_composes_as_dp_accounting_does():
  """Poisson central DP: dp-accounting's RDP accountant composing the planned rounds of
  PoissonSampled(Gaussian(z)) gives the planned RDP epsilon."""
  cfg = make_config({**SMALL, "num_clients": 300, "clients_per_round": 100,
                     "sampling": "poisson", "dp": "central", "noise_multiplier": 2.0,
                     "rounds": 50})
  planned = plan_privacy.plan(cfg)
  acc = dp_accounting.rdp.RdpAccountant()
  event = dp_accounting.PoissonSampledDpEvent(planned["q"], dp_accounting.GaussianDpEvent(2.0))
  acc.compose(event, planned["rounds_charged"])
  assert planned["rdp_epsilon"] == pytest.approx(acc.get_epsilon(cfg.delta), rel=1e-3)


def test_the_cli_plans_a_config_and_its_overrides():
  done = account("--config", "experiments/dp_digits.yaml")
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0] == ("dp central: poisson cohorts of 100 of 300 (q = 0.333333), 100 rounds; "
                      "neighbours: add/remove one client (Poisson sampling; sensitivity "
                      "clip_norm)")
  assert lines[1] == "noise multiplier 4.02875 (calibrated to target_epsilon 4)"
  assert lines[2].startswith("epsilon = 3.99") and "(RDP; as the run charges it)" in lines[2]
  stops = account("--config", "experiments/dp_digits.yaml", "--set", "noise_multiplier=2.0",
                  "--json")
  res = json.loads(stops.stdout)
  assert res["noise_multiplier_source"] == "configured" and res["rounds_charged"] < 100
  assert res["epsilon"] <= 4.0
  # no noise: no epsilon, as standard JSON (Infinity is not)
  none = account("--config", "experiments/dp_digits.yaml", "--set", "noise_multiplier=0",
                 "target_epsilon=null", "--json")
  assert none.returncode == 0, none.stderr

  def refuse(constant):
    raise ValueError(f"not standard JSON: {constant}")
  assert json.loads(none.stdout, parse_constant=refuse)["epsilon"] is None


@pytest.mark.parametrize("args,message", [
    (["--config", "experiments/demo.yaml"], "dp 'none': no differential-privacy guarantee"),
    (["--config", "experiments/demo.yaml", "--set", "s_local=0.5", "kept_noise=multiplier",
      "kept_noise_multiplier=1.0", "final_clip_l2=1.0", "index_selection=random_k"],
     "kept noise 'multiplier' is accounted by the run itself"),
    (["--config", "experiments/dp_digits.yaml", "--set", "dp=local", "noise_multiplier=2.0",
      "target_epsilon=null", "aggregator=cluster", "cluster_noise=equalize"],
     "cluster_noise 'equalize': the noise each round gets depends on the training"),
    (["--config", "experiments/dp_digits.yaml", "--q", "0.1"],
     "--q with --config/--set: the config states it; override it with --set "
     "clients_per_round=VALUE"),
    (["--config", "experiments/dp_digits.yaml", "--delta", "1e-6"], "--set delta=VALUE"),
    (["--config", "experiments/dp_digits.yaml", "--set", "noise_schedule=convergence"],
     "noise_schedule 'convergence': the noise each round gets depends on the training"),
    (["shuffle", "--config", "experiments/dp_digits.yaml"], "shuffle takes --eps0"),
    (["--config", "experiments/nothing.yaml"], "nothing.yaml"),
])
def test_the_cli_refuses_what_it_cannot_plan_in_one_line(args, message):
  done = account(*args)
  assert done.returncode == 2 and message in done.stderr, done.stderr
  assert len(done.stderr.strip().splitlines()) == 1
