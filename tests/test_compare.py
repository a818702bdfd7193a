"""fedjax-dp compare: the table's figures read back from the runs' own files."""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

import fedjax_dp
from fedjax_dp import make_config
from fedjax_dp.experiment.runner import run_experiment

BASE = {"dataset": "digits", "num_clients": 8, "clients_per_round": 4, "hidden": [16],
        "batch_size": 16, "local_epochs": 1, "lr": 0.05, "rounds": 4, "eval_every": 2,
        "devices": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two runs (one with central DP and another lr) and a sweep of two seeds."""
  root = tmp_path_factory.mktemp("compare")
  run_experiment(make_config(BASE), str(root / "plain"), progress=False, log=lambda m: None)
  run_experiment(make_config({**BASE, "lr": 0.1, "dp": "central", "noise_multiplier": 1.0,
                              "delta": 1e-3}), str(root / "private"), progress=False,
                 log=lambda m: None)
  fedjax_dp.sweep({"config": BASE, "seeds": 2}, out=str(root / "sw"), progress=False,
                  log=lambda m: None)
  return root


def jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_rows_hold_each_runs_final_and_best_figures_and_the_keys_that_differ(runs):
  rows = fedjax_dp.compare(str(runs / "plain"), str(runs / "private"))
  assert [r["run"] for r in rows] == ["plain", "private"]
  # the keys that differ, and only those (clip_norm and delta are read by the DP run only)
  assert [k for k in rows[0] if k not in ("run", "status")][:4] == ["lr", "dp", "noise_multiplier",
                                                                     "delta"]
  for row, name in zip(rows, ("plain", "private")):
    metrics = jsonl(runs / name / "metrics.jsonl")
    with open(runs / name / "summary.json") as f:
      summary = json.load(f)
    assert row["status"] == "finished" and row["round"] == metrics[-1]["round"] == 4
    assert row["test_accuracy"] == metrics[-1]["test_accuracy"]
    assert row["best_accuracy"] == max(m["test_accuracy"] for m in metrics)
    assert row["best_loss"] == min(m["test_loss"] for m in metrics)
    assert row["epsilon"] == summary["privacy"]["epsilon"]
    assert row["mb_up"] == metrics[-1]["bytes_up"] / 1e6
    assert row["s_per_round"] == summary["timing"]["seconds_per_round_median"]
  assert rows[0]["epsilon"] is None and rows[1]["epsilon"] > 0
  assert rows[0]["noise_multiplier"] is None and rows[1]["noise_multiplier"] == 1.0


def test_a_sweep_stands_for_its_cells_and_an_unfinished_run_says_so(runs, tmp_path):
  half = tmp_path / "half"
  shutil.copytree(runs / "plain", half)
  os.remove(half / "summary.json")
  rows = fedjax_dp.compare(str(runs / "sw"), str(half))
  assert [r["run"] for r in rows] == ["sw/seed=0", "sw/seed=1", "half"]
  assert [r["status"] for r in rows] == ["finished", "finished", "unfinished"]
  assert [r["seed"] for r in rows] == [0, 1, 0]
  assert rows[2]["s_per_round"] is None


def cli(*args, cwd=None):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, "compare", *args], capture_output=True, text=True, timeout=300,
                        cwd=cwd)


def test_cli_prints_sorts_and_writes_the_table_and_the_plot(runs, tmp_path):
  done = cli(str(runs / "plain"), str(runs / "private"), "--sort=-lr", "--csv",
             str(tmp_path / "t.csv"), "--plot", str(tmp_path / "p.png"))
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0].split()[:3] == ["run", "lr", "dp"]
  assert lines[2].startswith("private") and lines[3].startswith("plain")
  with open(tmp_path / "t.csv", newline="") as f:
    table = list(csv.DictReader(f))
  assert [r["run"] for r in table] == ["private", "plain"]
  assert os.path.getsize(tmp_path / "p.png") > 0


@pytest.mark.parametrize("args, fragment", [
    (["missing"], "missing: no such folder"),
    (["notarun"], "notarun: not a run folder (no readable config.json) and not a sweep"),
    (["RUN", "--sort", "speed"], "--sort speed: no column 'speed'"),
    (["RUN", "--plot", "p.txt"], "--plot p.txt: expected a .png file name"),
    (["RUN", "--csv", "taken.csv"], "--csv taken.csv: the file exists"),
])
def test_cli_errors_are_one_line_with_exit_status_2(runs, tmp_path, args, fragment):
  (tmp_path / "notarun").mkdir()
  (tmp_path / "taken.csv").write_text("x")
  args = [str(runs / "plain") if a == "RUN" else a for a in args]
  done = cli(*args, cwd=tmp_path)
  assert done.returncode == 2, done
  assert done.stderr.count("\n") == 1 and fragment in done.stderr, done.stderr


def test_the_guarantee_beside_epsilon_and_a_budget_stop_as_status(runs, tmp_path):
  """The first-hour review's finding 8: epsilons of different neighbouring relations in
  one column, and a run its budget stopped shown as finished."""
  from fedjax_dp.experiment import plan_privacy
  budget = make_config({**BASE, "dp": "central", "noise_multiplier": 2.0, "delta": 1e-3,
                        "sampling": "poisson", "target_epsilon": 2.0, "rounds": 8})
  assert plan_privacy.plan(budget)["rounds_charged"] < 8   # the budget stops it
  run_experiment(budget, str(tmp_path / "stopped"), progress=False, log=lambda m: None)
  fixed = make_config({**BASE, "dp": "central", "noise_multiplier": 2.0, "delta": 1e-3})
  run_experiment(fixed, str(tmp_path / "fixed"), progress=False, log=lambda m: None)
  rows = {r["run"]: r for r in fedjax_dp.compare(str(runs / "plain"), str(tmp_path / "stopped"),
                                                 str(tmp_path / "fixed"))}
  assert rows["stopped"]["status"] == "budget" and rows["fixed"]["status"] == "finished"
  assert rows["stopped"]["guarantee"] == "add/remove one client"
  assert rows["fixed"]["guarantee"] == "replace one client"
  assert rows["plain"]["guarantee"] is None
  keys = list(rows["fixed"])
  assert keys.index("guarantee") == keys.index("epsilon") + 1


def test_columns_choose_what_the_table_shows(runs):
  done = cli(str(runs / "plain"), str(runs / "private"), "--columns", "epsilon,lr")
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[0].split() == ["run", "epsilon", "lr"]
  bad = cli(str(runs / "plain"), str(runs / "private"), "--columns", "lr,speed")
  assert bad.returncode == 2 and "--columns lr,speed: no column 'speed'" in bad.stderr


def test_a_run_of_a_rule_this_process_has_not_registered_is_still_compared(runs, tmp_path):
  """The first-hour review's finding 3: one run of a rule registered from the user's own
  code broke the whole table (with an error naming --resume). compare only reads; the
  commands that rebuild the run name themselves and say how to register it."""
  mine = tmp_path / "mine"
  shutil.copytree(runs / "plain", mine)
  values = json.loads((mine / "config.json").read_text())
  (mine / "config.json").write_text(json.dumps({**values, "aggregator": "my_filter"}))
  rows = fedjax_dp.compare(str(runs / "plain"), str(mine))
  assert [r["aggregator"] for r in rows] == ["mean", "my_filter"]
  assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]
  with pytest.raises(fedjax_dp.RunError) as e:
    fedjax_dp.attack_mia(str(mine))
  message = str(e.value)
  assert message.startswith("attack_mia: ") and "'my_filter'" in message
  assert "list its file in the run's plugins (--set plugins=[FILE])" in message
  # the CLI imports the user's registrations first with --plugins
  plugin = tmp_path / "my_filter.py"
  plugin.write_text("from fedjax_dp.robust import get_aggregator, register_aggregator\n"
                    "register_aggregator(get_aggregator('median')._replace(name='my_filter'))\n")
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  refused = subprocess.run([exe, "attack", "mia", "--run", str(mine), "--examples", "20"],
                           capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2 and "pass it to fedjax-dp attack or compare as --plugins" in (
      refused.stderr)
  attacked = subprocess.run([exe, "attack", "mia", "--run", str(mine), "--examples", "20",
                             "--plugins", str(plugin)], capture_output=True, text=True,
                            timeout=300)
  assert attacked.returncode == 0, attacked.stderr
  shown = cli(str(mine), "--plugins", str(plugin), "--columns", "test_accuracy")
  assert shown.returncode == 0, shown.stderr
  missing = cli(str(mine), "--plugins", str(tmp_path / "nothing.py"))
  assert missing.returncode == 2 and "--plugins" in missing.stderr, missing.stderr


def test_the_plot_draws_a_sweeps_seeds_as_their_mean_and_sd(runs):
  from fedjax_dp.experiment.compare import _curves, load_runs
  import numpy as np
  loaded = load_runs([str(runs / "sw"), str(runs / "plain")])
  curves = {label: (rounds, values, sd) for label, rounds, values, sd in
            _curves(loaded, "test_accuracy")}
  assert set(curves) == {"sw/base (mean of 2 seeds)", "plain"}
  seeds = [[row["test_accuracy"] for row in jsonl(runs / "sw" / "cells" / f"seed={s}" /
                                                   "metrics.jsonl")] for s in (0, 1)]
  rounds, values, sd = curves["sw/base (mean of 2 seeds)"]
  np.testing.assert_allclose(values, np.mean(seeds, 0))
  np.testing.assert_allclose(sd, np.std(seeds, 0, ddof=1))
  assert curves["plain"][2] is None


def test_sweeps_of_one_name_stay_apart_and_epsilon_is_the_largest_seed(runs, tmp_path):
  """The independent audit: two sweeps whose folders share a name were averaged into one
  line, and a setting's epsilon drawn as the mean over its seeds (each seed a release of
  its own, so the mean is below some of their guarantees)."""
  from fedjax_dp.experiment.compare import _curves, load_runs
  other = tmp_path / "other" / "sw"
  shutil.copytree(runs / "sw", other)
  curves = _curves(load_runs([str(runs / "sw"), str(other)]), "test_accuracy")
  assert len(curves) == 2 and len({label for label, *_ in curves}) == 2
  private = load_runs([str(runs / "private"), str(runs / "plain")])
  for r in private:   # two seeds of one setting, epsilons 1 and 3
    r.setting = "sweep/x"
  private[0].rows = [dict(row, epsilon=1.0) for row in private[0].rows]
  private[1].rows = [dict(row, epsilon=3.0) for row in private[1].rows]
  ((label, _, values, sd),) = _curves(private, "epsilon")
  assert label == "sweep/x (largest of 2 seeds)" and set(values) == {3.0} and sd is None


def test_an_unfinished_or_local_budget_run_says_its_guarantee_and_status(runs, tmp_path):
  half = tmp_path / "half"
  shutil.copytree(runs / "private", half)
  os.remove(half / "summary.json")
  local = make_config({**BASE, "clients_per_round": 8, "dp": "local", "noise_multiplier": 2.0,
                       "delta": 1e-3, "target_epsilon": 6.0, "rounds": 6})
  run_experiment(local, str(tmp_path / "local"), progress=False, log=lambda m: None)
  rows = {r["run"]: r for r in fedjax_dp.compare(str(half), str(runs / "plain"),
                                                 str(tmp_path / "local"))}
  assert rows["half"]["status"] == "unfinished" and rows["half"]["epsilon"] > 0
  assert rows["half"]["guarantee"] == "replace one client"
  assert rows["local"]["status"] == "budget"
  assert rows["local"]["guarantee"] == "replace one client's data, largest client"
