"""experiments/topksdp/run.py end to end on a tiny budget: outputs, and reuse of
finished runs (never overwritten)."""

import csv
import os
import subprocess
import sys

import pytest

from fedjax_dp.data import load_dataset
from fedjax_dp.errors import DataError
from tests.helpers import one_device_env

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _fmnist_available():
  try:
    load_dataset("fmnist")
    return True
  except (DataError, Exception):
    return False


# ~16 s (Fashion-MNIST runs through the script): `make test-slow` (CI runs it); the
# reuse of runs is also test_run_or_reuse_reuses_same_settings_and_refuses_others
@pytest.mark.slow
@pytest.mark.skipif(not _fmnist_available(), reason="needs Fashion-MNIST (make fmnist-data)")
def test_table2_script_writes_tables_and_reuses_runs(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "topksdp", "run.py"), "table2",
         "--algorithms", "fedavg", "--seeds", "0", "--rounds", "2", "--out", str(tmp_path)]
  env = one_device_env()
  first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
  assert first.returncode == 0, first.stderr[-2000:]
  rows = list(csv.DictReader(open(tmp_path / "table2.csv")))
  assert len(rows) == 1 and rows[0]["algorithm"] == "fedavg" and float(rows[0]["final_accuracy"]) > 0
  md = (tmp_path / "table2.md").read_text()
  assert "| medium (0.5) | fedavg |" in md and "82.81" in md   # the paper's figure beside ours
  assert (tmp_path / "table2_medium.png").exists()
  summary = tmp_path / "table2" / "medium" / "fedavg" / "seed0" / "summary.json"
  before = summary.stat().st_mtime_ns
  second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
  assert second.returncode == 0 and "[run]" not in second.stdout   # reused
  assert summary.stat().st_mtime_ns == before


@pytest.mark.slow   # two small datasets through the script, about 40 s
@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_table2_script_reads_mnist_and_cifar_from_data_dir(dataset, tmp_path):
  """The MNIST and CIFAR-10 tables come from the same script when their files are
  given with --data-dir: small files in the real formats (IDX, gzipped; CIFAR's
  pickled batches), two methods, one round; the paper's figure for that dataset
  beside ours."""
  from tests.test_data import write_cifar, write_mnist_folder
  data = tmp_path / "data"
  if dataset == "mnist":
    write_mnist_folder(data, n_train=1200, n_test=100, gz=True)
  else:
    write_cifar(data / "cifar-10-batches-py", n=240)
  out = tmp_path / "out"
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "topksdp", "run.py"), "table2",
         "--dataset", dataset, "--data-dir", str(data), "--algorithms", "fedavg", "topksdp",
         "--seeds", "0", "--rounds", "1", "--out", str(out)]
  done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                        env=one_device_env())
  assert done.returncode == 0, done.stderr[-2000:]
  rows = list(csv.DictReader(open(out / "table2.csv")))
  assert sorted(r["algorithm"] for r in rows) == ["fedavg", "topksdp"]
  assert all(0 <= float(r["final_accuracy"]) <= 1 for r in rows)
  md = (out / "table2.md").read_text()
  assert {"mnist": "96.61", "cifar10": "62.59"}[dataset] in md   # the paper's TopkSDP-FL
  config = (out / "table2" / "medium" / "fedavg" / "seed0" / "config.json").read_text()
  assert f'"dataset": "{dataset}"' in config and str(data) in config
  if dataset == "cifar10":
    assert '"model": "cnn"' in config


def _topksdp_script():
  from tests.helpers import experiment_script
  return experiment_script("topksdp")


def test_topksdp_sweeps_write_tables_beside_the_papers_figures_and_plots(tmp_path):
  import argparse
  run = _topksdp_script()
  args = argparse.Namespace(out=str(tmp_path), dataset="mnist", rounds=2, seeds=[0, 1])
  dense = 2 * 4 * 199210 / 1e6
  rows = [{"s_global": sg, "seed": seed, "final_accuracy": acc, "mb_per_round_trip": mb,
           "dense_mb_per_round_trip": dense}
          for sg, mb, accs in ((0.0, 0.902, (0.80, 0.82)), (0.9, 0.209, (0.78, 0.79)))
          for seed, acc in zip((0, 1), accs)]
  run.write_outputs("sparsity", rows, args)
  md = (tmp_path / "sparsity.md").read_text()
  # 81.00 ± 1.41 = mean and sample sd of 80 and 82; 1 - 0.209 / 1.59368 = 86.9 % less
  assert "| 0 | 81.00 ± 1.41 | 0.902 |" in md and "| 0.9 | 78.50 ± 0.71 | 0.209 | 86.9 % | 93 % |" in md
  assert "0.96 MB per round trip against 13.4 MB" in md
  assert (tmp_path / "sparsity.png").exists()

  rows = [{"ldp_epsilon": eps, "s_local": sl, "seed": 0, "final_accuracy": acc,
           "papers_chain_epsilon": 12.5 * eps, "accountant_epsilon": None}
          for eps, sl, acc in ((1.0, 0.9, 0.5), (3.0, 0.9, 0.6), (3.0, 0.99, 0.7))]
  run.write_outputs("privacy", rows, _namespace_with(args, seeds=[0]))
  md = (tmp_path / "privacy.md").read_text()
  assert "| 3 | 0.99 | 70.00 | 37.5 | none (not a complete guarantee) | n/a |" in md
  assert "not a guarantee of this mechanism" in md and (tmp_path / "privacy.png").exists()

  # moon_params reads mu1 alone: its runs are at the grid's first mu2 only (run.mu)
  rows = [{"form": form, "mu1": a, "mu2": b, "seed": seed,
           "final_accuracy": 0.8 + a + b + 0.001 * seed - (0.1 if form == "moon_params" else 0),
           "diverged": form == "bounded" and a == b == 0.001 and seed == 1}
          for form in ("bounded", "moon_params")
          for a in (0.001, 0.01) for b in ((0.001, 0.01) if form == "bounded" else (0.001,))
          for seed in (0, 1)]
  run.write_outputs("mu", rows, args)
  md = (tmp_path / "mu.md").read_text()
  # rows mu1, columns mu2; cell (0.01, 0.01) = 100 * (0.82 + 0.0005) = 82.05
  assert "| 0.01 | 81.15 | 82.05 |" in md and "| 0.001 | 80.25 (diverged) | 81.15 |" in md
  assert "Best cell (bounded): 82.05 % at mu1 = 0.01, mu2 = 0.01; worst 80.25 %" in md
  # moon_params: one column, 100 * (0.7 + 0.01 + 0.001 + 0.0005) = 71.15
  assert "| mu1 | accuracy % |" in md and "| 0.01 | 71.15 |" in md
  assert "Best (moon_params): 71.15 % at mu1 = 0.01; worst 70.25 %" in md and "96.61 %" in md
  assert (tmp_path / "mu.png").exists()

  # FedADMM's tuning: per (rho, server step), mean ± sd over seeds of each column
  rows = [{"admm_upload": up, "admm_rho": rho, "server_lr": slr, "seed": seed,
           "final_accuracy": f, "best_accuracy": f + 0.02, "last_quarter_min": f - 0.1 * rho}
          for up, rho, slr, accs in (("augmented", 0.01, 1.0, (0.70, 0.72)),
                                     ("change", 0.1, 0.5, (0.80, 0.80)))
          for seed, f in zip((0, 1), accs)]
  run.write_outputs("fedadmm", rows, args)
  md = (tmp_path / "fedadmm.md").read_text()
  assert "| augmented | 0.01 | 1 | 71.00 ± 1.41 | 73.00 ± 1.41 | 70.90 ± 1.41 |" in md
  assert "| change | 0.1 | 0.5 | 80.00 ± 0.00 | 82.00 ± 0.00 | 79.00 ± 0.00 |" in md
  assert "Best setting: upload change, rho 0.1, server step 0.5: 80.00 %" in md
  assert (tmp_path / "fedadmm.png").exists()


def test_topksdp_cells_of_the_acting_mu_arm_and_of_moon_params():
  """Table 2's topksdp_mu2_1 arm is TopkSDP-FL at mu2 = 1 in its own folders; the mu
  grid runs moon_params (which reads mu1 alone) at one mu2, bounded at every pair."""
  import argparse
  run = _topksdp_script()
  args = argparse.Namespace(levels=["high"], algorithms=["topksdp", "topksdp_mu2_1", "moon"],
                            seeds=[0])
  cells = {name: sets for name, sets, _ in run.table2(args)}
  assert cells["table2/high/topksdp_mu2_1/seed0"] == dict(
      algorithm="topksdp", contrastive_mu2=1.0, alpha=0.1, seed=0)
  assert cells["table2/high/topksdp/seed0"] == dict(algorithm="topksdp", alpha=0.1, seed=0)
  assert cells["table2/high/moon/seed0"]["moon_mu"] == 1.0
  names = [name for name, _, _ in run.mu(argparse.Namespace(
      forms=["bounded", "moon_params"], mu_grid=[0.1, 1.0, 10.0], seeds=[0]))]
  assert len(names) == 9 + 3 and "mu/mu1_10/mu2_0.1/seed0" in names
  assert [n for n in names if "moon" in n] == [f"mu/moon_params/mu1_{m}/mu2_0.1/seed0"
                                               for m in ("0.1", "1", "10")]


def _namespace_with(ns, **kw):
  import argparse
  return argparse.Namespace(**{**vars(ns), **kw})


@pytest.mark.slow
def test_dynamic_dp_script_writes_tables_with_both_epsilons(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "dynamic_dp", "run.py"), "table4",
         "--rounds", "3", "--analyzer-steps", "20", "--out", str(tmp_path)]
  env = one_device_env()
  first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert first.returncode == 0, first.stderr[-2000:]
  rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "paper" / "table4.csv"))}
  assert set(rows) == {"no_privacy", "static_dp_eps2.0_800r", "static_dp_eps1.9",
                       "dynamic_dp_eps1.9", "static_dp_paper_formula",
                       "dynamic_dp_paper_formula"}
  # calibrated arms stay within their accounted target; the paper-formula arms report both
  assert float(rows["static_dp_eps1.9"]["epsilon_accountant"]) <= 1.9
  assert float(rows["dynamic_dp_eps1.9"]["epsilon_accountant"]) <= 1.9
  assert float(rows["static_dp_paper_formula"]["epsilon_paper_formula"]) > 0
  md = (tmp_path / "paper" / "table4.md").read_text()
  assert "96.1 / 1.9 / 1350" in md and "NOT a guarantee" in md
  assert (tmp_path / "paper" / "table4.png").exists()
  second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert second.returncode == 0 and "[run]" not in second.stdout   # reused


def test_run_or_reuse_reuses_same_settings_and_refuses_others(tmp_path):
  """Found by an audit: the sweep scripts reused any finished run folder, so a
  table asked for 3 rounds (or another dataset) reported a 1-round run's
  figures under the new settings."""
  import json
  from fedjax_dp import make_config
  from fedjax_dp.experiment.runner import run_or_reuse
  from fedjax_dp.errors import RunError
  cfg = make_config(dict(dataset="digits", num_clients=4, clients_per_round=2, hidden=[8],
                         rounds=2, eval_every=1, devices=1))
  out = str(tmp_path / "run")
  run_or_reuse(cfg, out, progress=False, log=lambda m: None)
  summary = tmp_path / "run" / "summary.json"
  stamp = summary.stat().st_mtime_ns
  again = run_or_reuse(make_config({"client_batch": 2, "checkpoint_every": 1}, cfg), out,
                       progress=False, log=lambda m: None)   # how it runs, not what: reused
  assert summary.stat().st_mtime_ns == stamp and again == json.load(open(summary))
  for change, shown in (({"rounds": 3}, "rounds 2 there, 3 asked"),
                        ({"dataset": "synthetic"}, "dataset 'digits' there, 'synthetic' asked")):
    with pytest.raises(RunError, match=shown + ".*--overwrite"):
      run_or_reuse(make_config(change, cfg), out, progress=False, log=lambda m: None)
    assert summary.stat().st_mtime_ns == stamp
  rerun = run_or_reuse(make_config({"rounds": 3}, cfg), out, overwrite=True, progress=False,
                       log=lambda m: None)
  assert rerun["rounds"] == 3 and json.load(open(summary))["rounds"] == 3
  os.remove(summary)                        # unfinished: resumed to the rounds asked
  resumed = run_or_reuse(make_config({"rounds": 4}, cfg), out, progress=False,
                         log=lambda m: None)
  assert resumed["rounds"] == 4


def test_experiment_scripts_give_one_line_errors_and_keep_stale_runs(tmp_path, capsys):
  import json
  run = _topksdp_script()
  args = ["table2", "--algorithms", "fedavg", "--seeds", "0", "--out", str(tmp_path)]
  with pytest.raises(SystemExit) as e:                   # argparse: one line, status 2
    run.main(args[:3] + ["--seeds", "0", "0", "--out", str(tmp_path)])
  assert e.value.code == 2 and "--seeds 0 0: each value at most once" in capsys.readouterr().err
  assert run.main(args + ["--rounds", "0"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "'rounds' = 0" in err and "Traceback" not in err
  (tmp_path / "file").write_text("x")
  assert run.main(args[:-1] + [str(tmp_path / "file" / "out")]) == 2
  assert "cannot make the folder" in capsys.readouterr().err
  # a finished run made with 3 rounds is not reported as a 2-round one
  folder = tmp_path / "table2" / "medium" / "fedavg" / "seed0"
  folder.mkdir(parents=True)
  cfg = run.load_config(os.path.join(ROOT, "experiments", "topksdp", "base.yaml"),
                        ["algorithm=\"fedavg\"", "alpha=0.5", "seed=0", "dataset=\"fmnist\"",
                         "rounds=3"])
  (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
  (folder / "summary.json").write_text("{}")
  assert run.main(args + ["--rounds", "2"]) == 2
  err = capsys.readouterr().err
  assert "rounds 3 there, 2 asked" in err and err.count("\n") == 1
  assert not (tmp_path / "table2.csv").exists() and (folder / "summary.json").read_text() == "{}"


def _regression_example(out, *extra):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "own_model_regression.py"),
         "--out", str(out), "--no-progress", "--clients", "30", "--clients-per-round", "10",
         "--eval-every", "2", "--checkpoint-every", "2", "--noise-multiplier", "0.5", *extra]
  env = one_device_env()
  return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow   # ~17 s: make test-slow, so make test stays under 10 minutes
def test_own_model_regression_example_writes_full_outputs(tmp_path):
  """experiments/own_model_regression.py: a flax regressor with the MSE loss on numpy data
  through fedjax_dp.run under central DP."""
  import json
  import importlib.util
  import numpy as np
  straight = tmp_path / "straight"
  done = _regression_example(straight, "--rounds", "6")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "test mse" in done.stdout and "epsilon" in done.stdout
  rows = [json.loads(line) for line in open(straight / "metrics.jsonl")]
  assert [r["round"] for r in rows] == [2, 4, 6]
  spec = importlib.util.spec_from_file_location(
      "own_model_regression", os.path.join(ROOT, "experiments", "own_model_regression.py"))
  example = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = example   # flax modules (dataclasses) look their module up
  spec.loader.exec_module(example)
  _, y, _ = example.synthetic_clients(30, 8, 0)
  for r in rows:
    assert r["test_loss"] == r["test_mse"] and 0 < r["test_mae"] <= np.sqrt(r["test_mse"])
  # it learns: below the variance of the targets (predicting their mean), and improving
  assert rows[-1]["test_mse"] < 0.5 * np.var(y) and rows[-1]["test_mse"] < rows[0]["test_mse"]
  assert [r["epsilon"] for r in rows] == sorted(r["epsilon"] for r in rows)
  summary = json.load(open(straight / "summary.json"))
  privacy = summary["privacy"]
  assert privacy["dp"] == "central" and privacy["delta"] == 1e-5
  assert privacy["epsilon"] == pytest.approx(rows[-1]["epsilon"]) and privacy["epsilon"] > 0
  assert summary["model"]["name"] == "mlp_regressor" and summary["data"]["dataset"] == "custom"
  assert sorted(os.listdir(straight / "checkpoints")) == ["2", "4", "6"]
  for png in ("mse.png", "mae.png", "loss.png", "epsilon.png"):
    assert (straight / png).exists()


# slow: three more processes (~12 s) for what runs in-process elsewhere (an existing
# folder refused: test_run_cli; a resume equal to a straight run: test_callbacks,
# test_run_cli; an own regression model resumed: test_callbacks); here through the script
@pytest.mark.slow
def test_own_model_regression_example_refuses_a_used_folder_and_resumes_bit_for_bit(tmp_path):
  import json
  straight = tmp_path / "straight"
  assert _regression_example(straight, "--rounds", "6").returncode == 0
  # a second run into the same folder is refused in one line and changes nothing
  before = (straight / "metrics.jsonl").read_text()
  again = _regression_example(straight, "--rounds", "6")
  assert again.returncode == 2 and again.stderr.startswith("error: output folder")
  assert again.stderr.count("\n") == 1 and (straight / "metrics.jsonl").read_text() == before
  # 4 rounds, then resumed to 6: the same numbers as the straight run
  resumed = tmp_path / "resumed"
  assert _regression_example(resumed, "--rounds", "4").returncode == 0
  more = _regression_example(resumed, "--rounds", "6", "--resume")
  assert more.returncode == 0, more.stderr[-2000:]
  strip = lambda path: [{k: v for k, v in json.loads(line).items() if k != "wall_s"}
                        for line in open(path)]
  assert strip(resumed / "metrics.jsonl") == strip(straight / "metrics.jsonl")
