"""Sweeps: cells from a sweep file, replicas checked against standalone runs, the tidy
table against the cells' own metrics, resumption, and the CLI's errors."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError, RunError
from fedjax_dp.sweeps import load_sweep
from fedjax_dp.sweeps.run import read_record

BASE = {"dataset": "digits", "num_clients": 8, "clients_per_round": 4, "hidden": [16],
        "batch_size": 16, "local_epochs": 1, "lr": 0.05, "rounds": 4, "eval_every": 2,
        "devices": 1}
DP = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-3}


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def without_wall(rows):
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def run_alone(cfg, out):
  """The cell's config as an ordinary run."""
  from fedjax_dp.experiment.runner import run_experiment
  run_experiment(cfg, str(out), progress=False, log=lambda m: None)
  return read_jsonl(os.path.join(out, "metrics.jsonl"))


# --------------------------------------------------------------------------- the sweep file


def test_cells_cross_variants_grid_and_seeds_and_share_the_data():
  spec = load_sweep({"config": BASE, "seeds": [3, 5], "grid": {"lr": [0.05, 0.1]},
                     "variants": [{"algorithm": "fedavg"}, {"algorithm": "fedprox",
                                                             "prox_mu": 0.01}]})
  cells = spec.cells()
  assert [c.name for c in cells[:4]] == ["algorithm=fedavg,lr=0.05,seed=3",
                                         "algorithm=fedavg,lr=0.05,seed=5",
                                         "algorithm=fedavg,lr=0.1,seed=3",
                                         "algorithm=fedavg,lr=0.1,seed=5"]
  assert cells[4].name == "algorithm=fedprox,prox_mu=0.01,lr=0.05,seed=3"
  assert len(cells) == 8
  for c in cells:   # the base's seed (0) seeds every cell's data
    assert c.cfg.data_seed == 0 and c.cfg.seed == c.values["seed"]
    assert c.cfg == make_config({**BASE, **c.values, "data_seed": 0})
  assert spec.named_keys() == ["algorithm", "prox_mu", "lr", "seed"]


def test_a_base_file_is_read_relative_to_the_sweep_file(tmp_path):
  (tmp_path / "base.yaml").write_text("dataset: digits\nrounds: 7\n")
  (tmp_path / "s.yaml").write_text("base: base.yaml\nconfig: {lr: 0.2}\nseeds: 2\n")
  cells = load_sweep(str(tmp_path / "s.yaml"), ["eval_every=7"]).cells()
  assert [c.name for c in cells] == ["seed=0", "seed=1"]
  assert all(c.cfg.rounds == 7 and c.cfg.lr == 0.2 and c.cfg.eval_every == 7 for c in cells)


@pytest.mark.parametrize("raw, fragment", [
    ({"grids": {"lr": [1]}}, "unknown key 'grids' (did you mean 'grid'?"),
    ({"grid": {"seed": [1, 2]}}, "'seed' in grid or variants: list seeds under seeds:"),
    ({"grid": {"lr": 0.1}}, "grid key 'lr' = 0.1: expected a non-empty list"),
    ({"grid": {"lr": [0.1]}, "variants": [{"lr": 0.2}]}, "'lr' is in both grid and variants"),
    ({"seeds": 0}, "seeds = 0: expected a count n >= 1"),
    ({"seeds": [1, 1]}, "seeds = [1, 1]"),
    ({"replica_batch": 0}, "replica_batch = 0: expected auto or an integer >= 1"),
    ({"variants": [{}]}, "variants = [{}]: expected a list of non-empty mappings"),
    ({"grid": {"lr": [0.1, -1.0]}}, "sweep cell 'lr=-1.0,seed=0': config key 'lr' = -1.0"),
    ({"grid": {"prox_mu": [0.0, 0.1]}}, "sweep cell 'prox_mu=0.0,seed=0': config key 'prox_mu' = 0.0 "
                                          "is read by nothing"),
    ({"grid": {"lr": [0.1, 0.10]}}, "grid key 'lr' lists 0.1 twice"),
    ({"grid": {"hidden": [[16], "16"]}}, "sweep cells 'hidden=16,seed=0' and "
                                         "'hidden=16,seed=0' are the same run"),
    ({"base": "missing.yaml"}, "does not exist"),
])
def test_a_bad_sweep_is_one_line_naming_the_problem(raw, fragment):
  with pytest.raises(ConfigError) as e:
    load_sweep({"config": BASE, **raw}).cells()
  assert fragment in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------ the replicas


@pytest.mark.slow   # ~19 s: make test-slow, so make test stays under 10 minutes
def test_replicas_one_at_a_time_are_bit_for_bit_the_standalone_runs(tmp_path):
  # replica_batch 1: one compiled program, each cell exactly its own `fedjax-dp run`
  spec = {"config": {**BASE, **DP}, "seeds": 2, "grid": {"noise_multiplier": [0.8, 1.5]}}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), replica_batch=1, progress=False,
                           log=lambda m: None)
  assert len(record["programs"]) == 1 and record["programs"][0]["replica_batch"] == 1
  for cell in load_sweep(spec).cells():
    here = tmp_path / "s" / "cells" / cell.name
    alone = run_alone(cell.cfg, tmp_path / cell.name)
    assert without_wall(read_jsonl(here / "metrics.jsonl")) == without_wall(alone)
    assert (here / "model.msgpack").read_bytes() == (
        tmp_path / cell.name / "model.msgpack").read_bytes()
  eps = {c["cell"]: c["epsilon"] for c in read_csv(tmp_path / "s" / "results.csv")}
  assert float(eps["noise_multiplier=0.8,seed=0"]) > float(eps["noise_multiplier=1.5,seed=0"])


def read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_vmapped_replicas_match_the_standalone_runs_and_stop_on_their_own_budgets(tmp_path):
  # replica_batch 4: four runs in one vmapped program; their noise, lr and seeds are
  # their own (metrics as the standalone runs' up to float rounding, privacy exactly),
  # and the target epsilon ends each at its own round
  spec = {"config": {**BASE, **DP, "rounds": 6, "target_epsilon": 30.0},
          "seeds": 2, "grid": {"noise_multiplier": [0.7, 1.4]}}
  fedjax_dp.sweep(spec, out=str(tmp_path / "s"), replica_batch=4, progress=False,
                  log=lambda m: None)
  rounds = set()
  for cell in load_sweep(spec).cells():
    here = read_jsonl(tmp_path / "s" / "cells" / cell.name / "metrics.jsonl")
    alone = run_alone(cell.cfg, tmp_path / cell.name)
    assert [r["round"] for r in here] == [r["round"] for r in alone]
    rounds.add(here[-1]["round"])
    for a, b in zip(here, alone):
      for key in ("epsilon", "bytes_up", "clip_norm"):
        assert a[key] == b[key], key
      for key in ("test_accuracy", "test_loss", "train_loss"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    with open(tmp_path / "s" / "cells" / cell.name / "summary.json") as f:
      summary = json.load(f)
    with open(tmp_path / cell.name / "summary.json") as f:
      alone_summary = json.load(f)
    assert summary["privacy"]["epsilon"] == alone_summary["privacy"]["epsilon"]
    assert summary["rounds"] == alone_summary["rounds"]
  assert len(rounds) == 2   # the low-noise replicas stopped earlier


# the sharded table's replicas: 9 s, `make test-slow` (test_sharding checks the table itself)
@pytest.mark.parametrize("cohort", [8, pytest.param(3, marks=pytest.mark.slow)])
def test_vmapped_replicas_on_eight_devices_equal_one_device(tmp_path, cohort):
  # SCAFFOLD's per-client table over 8 devices: resident (every client every round),
  # or sharded in blocks of ids (a cohort of 3 of the 8 drawn each round)
  spec = {"config": {**BASE, "algorithm": "scaffold", "clients_per_round": cohort, "devices": 0},
          "seeds": 2, "grid": {"lr": [0.05, 0.1]}}
  results = []
  for devices in (1, 8):
    out = tmp_path / f"d{devices}"
    fedjax_dp.sweep({**spec, "config": {**spec["config"], "devices": devices}}, out=str(out),
                    replica_batch=4, progress=False, log=lambda m: None)
    results.append(read_csv(out / "results.csv"))
  one, eight = results
  assert [r["cell"] for r in one] == [r["cell"] for r in eight]
  for a, b in zip(one, eight):
    assert float(a["test_loss"]) == pytest.approx(float(b["test_loss"]), rel=1e-4)


def test_a_host_table_of_client_state_runs_its_cells_one_at_a_time(tmp_path):
  # a paged table is one run's: replica_batch 4 is run as 1, each cell its standalone run
  spec = {"config": {**BASE, "algorithm": "scaffold", "client_state_store": "host"},
          "seeds": 2}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), replica_batch=4, progress=False,
                           log=lambda m: None)
  assert record["programs"][0]["replica_batch"] == 1
  cell = load_sweep(spec).cells()[1]
  assert without_wall(read_jsonl(tmp_path / "s" / "cells" / cell.name / "metrics.jsonl")) == \
      without_wall(run_alone(cell.cfg, tmp_path / "alone"))


def test_structural_changes_make_programs_of_their_own(tmp_path):
  spec = {"config": BASE, "variants": [{"momentum": 0.0}, {"momentum": 0.5},
                                       {"momentum": 0.9}, {"algorithm": "fedprox"}]}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), progress=False, log=lambda m: None)
  programs = [p["cells"] for p in record["programs"]]
  # momentum on or off is structure, 0.5 -> 0.9 is data; fedprox is another objective
  assert sorted(map(sorted, programs)) == sorted(
      [["momentum=0.0,seed=0"], ["momentum=0.5,seed=0", "momentum=0.9,seed=0"],
       ["algorithm=fedprox,seed=0"]])


# ------------------------------------------------------------------------ table and resuming


def test_the_tidy_table_is_every_cells_metrics_and_final_csv_their_means(tmp_path):
  import pyarrow.parquet as pq
  spec = {"config": BASE, "seeds": 3, "grid": {"lr": [0.05, 0.2]}}
  out = tmp_path / "s"
  record = fedjax_dp.sweep(spec, out=str(out), progress=False, log=lambda m: None)
  rows = read_csv(out / "results.csv")
  expected = []
  for cell in load_sweep(spec).cells():
    for r in read_jsonl(out / "cells" / cell.name / "metrics.jsonl"):
      expected.append((cell.name, cell.cfg.lr, cell.cfg.seed, r["round"], r["test_accuracy"]))
  assert [(r["cell"], float(r["lr"]), int(r["seed"]), int(r["round"]),
           float(r["test_accuracy"])) for r in rows] == expected
  table = pq.read_table(out / "results.parquet").to_pylist()
  assert [(t["cell"], t["lr"], t["seed"], t["round"], t["test_accuracy"]) for t in table] == \
      expected
  final = {r["setting"]: r for r in read_csv(out / "final.csv")}
  for lr in (0.05, 0.2):
    last = [e[4] for e in expected if e[1] == lr and e[3] == 4]
    row = final[f"lr={lr!r}"]
    assert int(row["seeds"]) == 3
    assert float(row["test_accuracy_mean"]) == pytest.approx(np.mean(last), rel=1e-12)
    assert float(row["test_accuracy_sd"]) == pytest.approx(np.std(last, ddof=1), rel=1e-9)
  assert {os.path.basename(p) for p in record["plots"]} >= {"accuracy.png", "loss.png"}
  assert all(os.path.getsize(p) > 0 for p in record["plots"])
  # past MAX_PLOTTED_SETTINGS settings the plots (this sweep's earlier ones too) go
  from fedjax_dp.sweeps import table
  cells = load_sweep(spec).cells()
  again = table.write_results(str(out), cells, ["lr", "seed"], fedjax_dp.losses.CLASSIFICATION)
  assert again["plots"] and "plots_skipped" not in again
  import unittest.mock
  with unittest.mock.patch.object(table, "MAX_PLOTTED_SETTINGS", 1):
    skipped = table.write_results(str(out), cells, ["lr", "seed"],
                                  fedjax_dp.losses.CLASSIFICATION)
  assert skipped["plots"] == [] and skipped["plots_skipped"].startswith("2 settings")
  assert not (out / "accuracy.png").exists() and (out / "final.csv").exists()


def test_a_killed_sweep_keeps_its_finished_cells_and_continues(tmp_path):
  # replica_batch 1: cells one after the other on any device (a GPU's auto would
  # vmap the three, and the kill would stop all of them at once)
  spec = {"config": {**BASE, "checkpoint_every": 2}, "seeds": 3, "replica_batch": 1}
  out = tmp_path / "s"
  seen = []

  def kill_in_the_third_cell(ctx, stats):
    seen.append(ctx.out)
    if len(set(seen)) == 3:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    fedjax_dp.sweep(spec, out=str(out), progress=False, log=lambda m: None,
                    callbacks=[fedjax_dp.callbacks.Callback(after_chunk=kill_in_the_third_cell)])
  done = {c: os.path.getmtime(out / "cells" / c / "summary.json") for c in ("seed=0", "seed=1")}
  assert not (out / "cells" / "seed=2" / "summary.json").exists()
  messages = []
  fedjax_dp.sweep(spec, out=str(out), progress=False, log=messages.append)
  assert any("2 of 3 cells finished (kept)" in m for m in messages)
  assert any("[seed=2] resuming" in m and "round 2" in m for m in messages)
  for c, t in done.items():
    assert os.path.getmtime(out / "cells" / c / "summary.json") == t
  fedjax_dp.sweep(spec, out=str(tmp_path / "whole"), progress=False, log=lambda m: None)
  strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
  assert strip(read_csv(out / "results.csv")) == strip(read_csv(tmp_path / "whole" /
                                                                "results.csv"))


def test_a_cell_folder_holding_another_run_is_refused_before_anything_runs(tmp_path):
  out = tmp_path / "s"
  fedjax_dp.sweep({"config": BASE, "seeds": 2}, out=str(out), progress=False,
                  log=lambda m: None)
  before = os.path.getmtime(out / "sweep.json")
  with pytest.raises(RunError, match="other settings .*lr 0.05 there, 0.1 asked"):
    fedjax_dp.sweep({"config": {**BASE, "lr": 0.1}, "seeds": 3}, out=str(out),
                    progress=False, log=lambda m: None)
  assert os.path.getmtime(out / "sweep.json") == before
  assert not (out / "cells" / "seed=2").exists()
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("mine")
  with pytest.raises(RunError, match="not empty and holds no sweep"):
    fedjax_dp.sweep({"config": BASE}, out=str(tmp_path / "other"), progress=False)


# ------------------------------------------------------------------------------------- CLI


def fedjax_dp_cli(*args, cwd=None):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_cli_runs_a_sweep_file_and_prints_each_settings_figures(tmp_path):
  import yaml
  path = tmp_path / "sweep.yaml"
  path.write_text(yaml.safe_dump({"config": BASE, "seeds": 2, "grid": {"lr": [0.05, 0.1]}}))
  done = fedjax_dp_cli("sweep", str(path), "--out", str(tmp_path / "s"), "--no-progress",
                       "--set", "rounds=2")
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0].startswith("lr=0.05 (2 seeds, round 2): test accuracy ")
  assert lines[1].startswith("lr=0.1 (2 seeds, round 2): test accuracy ")
  assert any(l.startswith("results: ") and "results.parquet" in l for l in lines)
  assert read_record(str(tmp_path / "s"))["spec"]["base"]["rounds"] == 2
  listed = fedjax_dp_cli("sweep", str(path), "--print-cells")
  assert listed.stdout.split() == ["lr=0.05,seed=0", "lr=0.05,seed=1", "lr=0.1,seed=0",
                                   "lr=0.1,seed=1"]


@pytest.mark.parametrize("content, args, fragment", [
    ("grid: {lr: [0.1]}\nseed: 3\n", [], "unknown key 'seed' (did you mean 'seeds'?"),
    ("grid: {lr: [0.1]}\n", ["--replica-batch", "two"], "--replica-batch: replica_batch = "
                                                       "'two'"),
    ("grid: {lr: [0.1]}\n", [], "fedjax-dp sweep: --out is required"),
    ("grid: [lr]\n", ["--out", "x"], "grid = ['lr']: expected a mapping"),
])
def test_cli_errors_are_one_line_with_exit_status_2(tmp_path, content, args, fragment):
  path = tmp_path / "sweep.yaml"
  path.write_text(content)
  done = fedjax_dp_cli("sweep", str(path), *args, cwd=tmp_path)
  assert done.returncode == 2, done
  assert done.stderr.count("\n") == 1 and fragment in done.stderr, done.stderr
  assert not (tmp_path / "x").exists()


def test_a_ctrl_c_names_the_command_that_continues_the_sweep(tmp_path, capsys, monkeypatch):
  # the whole command, --set included: the same cells must be asked for again
  import fedjax_dp.sweeps
  from fedjax_dp import cli

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(fedjax_dp.sweeps, "run_sweep", interrupted)
  path = tmp_path / "my sweep.yaml"
  path.write_text("seeds: 2\n")
  code = cli.main(["sweep", str(path), "--out", str(tmp_path / "s"), "--set", "rounds=3",
                   "lr=0.1", "--replica-batch", "2"])
  assert code == cli.INTERRUPTED
  err = capsys.readouterr().err
  assert err == (f"interrupted; `fedjax-dp sweep '{path}' --out {tmp_path / 's'} --set rounds=3 "
                 "lr=0.1 --replica-batch 2` keeps the finished cells and continues the others\n")


def test_more_seeds_later_keep_the_cells_already_run(tmp_path):
  # a cell is named by every key it sets (seed included), varied or not
  out = tmp_path / "s"
  fedjax_dp.sweep({"config": BASE, "grid": {"lr": [0.05]}}, out=str(out), progress=False,
                  log=lambda m: None)
  assert os.listdir(out / "cells") == ["lr=0.05,seed=0"]
  said = []
  fedjax_dp.sweep({"config": BASE, "grid": {"lr": [0.05, 0.1]}, "seeds": 2}, out=str(out),
                  progress=False, log=said.append)
  assert any("1 of 4 cells finished (kept)" in m for m in said)
  assert sorted(os.listdir(out / "cells")) == ["lr=0.05,seed=0", "lr=0.05,seed=1",
                                               "lr=0.1,seed=0", "lr=0.1,seed=1"]


def test_your_own_data_model_and_loss_in_every_cell(tmp_path):
  from sklearn.datasets import load_digits
  from fedjax_dp.callbacks import Callback
  d = load_digits()
  x, y = d.data.astype(np.float32) / 16, d.target.astype(np.int32)
  data = fedjax_dp.data.from_arrays(x, y, client_ids=np.arange(len(y)) % 8, test_fraction=0.2)
  config = {k: v for k, v in BASE.items() if k not in ("dataset", "num_clients")}
  spec = {"config": {**config, "checkpoint_every": 2}, "seeds": 2, "replica_batch": 1}
  out = tmp_path / "s"

  def stop_in_the_second_cell(ctx, stats):
    if ctx.out.endswith("seed=1") and ctx.round == 2:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    fedjax_dp.sweep(spec, out=str(out), data=data, progress=False, log=lambda m: None,
                    callbacks=[Callback(after_chunk=stop_in_the_second_cell)])
  with open(out / "cells" / "seed=0" / "inputs.json") as f:
    assert json.load(f)["data"]["name"] == data.name
  other = fedjax_dp.data.from_arrays(x[::-1].copy(), y[::-1].copy(),
                                     client_ids=np.arange(len(y)) % 8, test_fraction=0.2)
  # seed=0 finished and seed=1 stopped at round 2: neither goes on with other data
  with pytest.raises(RunError, match="holds a run with other inputs"):
    fedjax_dp.sweep(spec, out=str(out), data=other, progress=False, log=lambda m: None)
  record = fedjax_dp.sweep(spec, out=str(out), data=data, progress=False, log=lambda m: None)
  assert [len(p["cells"]) for p in record["programs"]] == [1]   # seed=1 resumed, seed=0 kept


def test_vmapped_replicas_resumed_at_their_last_round_write_their_summaries(tmp_path):
  spec = {"config": {**BASE, "checkpoint_every": 2}, "seeds": 2}
  out = tmp_path / "s"
  fedjax_dp.sweep(spec, out=str(out), replica_batch=2, progress=False, log=lambda m: None)
  summaries = {c: (out / "cells" / c / "summary.json").read_text() for c in ("seed=0", "seed=1")}
  for c in summaries:   # killed after the last checkpoint, before the summaries
    os.remove(out / "cells" / c / "summary.json")
  fedjax_dp.sweep(spec, out=str(out), replica_batch=2, progress=False, log=lambda m: None)
  for c, before in summaries.items():
    after = json.loads((out / "cells" / c / "summary.json").read_text())
    assert after["final"] == json.loads(before)["final"]


def test_a_target_no_round_can_meet_is_refused_before_any_cell_runs(tmp_path):
  spec = {"config": BASE, "variants": [{"lr": 0.1}, {**DP, "target_epsilon": 0.5}]}
  with pytest.raises(RunError, match="sweep cell .*target_epsilon 0.5 is below one round's"):
    fedjax_dp.sweep(spec, out=str(tmp_path / "s"), progress=False, log=lambda m: None)
  assert not (tmp_path / "s" / "cells").exists()


def test_final_rows_average_the_seeds_with_a_finite_figure():
  from fedjax_dp.sweeps.table import final_lines, final_rows
  from fedjax_dp.experiment import reporting
  rows = [{"cell": f"seed={s}", "setting": "all", "seed": s, "round": r,
           "test_accuracy": acc, "epsilon": None}
          for s, r, acc in ((0, 4, 0.5), (1, 4, None), (2, 3, 0.7))]
  (final,) = final_rows(rows, ["seed"])
  assert final["seeds"] == 3 and final["round"] == 4 and final["round_min"] == 3
  assert final["test_accuracy_mean"] == pytest.approx(0.6)
  assert final["test_accuracy_sd"] == pytest.approx(np.std([0.5, 0.7], ddof=1))
  assert final["test_accuracy_seeds"] == 2 and "epsilon_mean" not in final
  import tempfile
  with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    f.write(reporting.csv_text([final]))
  assert final_lines(f.name) == ["all (3 seeds, rounds 3-4): test accuracy 0.6000 +- 0.1414 "
                                 "(2 seeds finite)"]



@pytest.mark.slow   # one to three minutes each
@pytest.mark.parametrize("dataset,model", [("shakespeare_tff", "char_lstm_seq"),
                                           ("stackoverflow", "word_lstm"),
                                           ("femnist", "leaf_cnn"),
                                           ("cifar100", "resnet18")])
def test_vmapped_replicas_of_the_benchmark_models_match_their_standalone_runs(
    tmp_path, dataset, model):
  """The benchmarks' models and datasets as vmapped replicas (two learning rates in
  one program): each cell's metrics are its own run's to float rounding; the
  sequence task (next_token) comes from the dataset in both."""
  from fedjax_dp.data.sample_files import write_sample
  write_sample(dataset, str(tmp_path / "data"), num_clients=8, examples_per_client=6)
  config = {"dataset": dataset, "data_dir": str(tmp_path / "data"), "model": model,
            "partition": "natural_id", "num_clients": 6, "test_clients": 2,
            "clients_per_round": 3, "batch_size": 4, "local_epochs": 1, "rounds": 2,
            "eval_every": 1, "devices": 1, **DP}
  spec = {"config": config, "grid": {"lr": [0.05, 0.5]}}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), replica_batch=2, progress=False,
                           log=lambda m: None)
  assert record["programs"][0]["replica_batch"] == 2
  for cell in load_sweep(spec).cells():
    here = read_jsonl(tmp_path / "s" / "cells" / cell.name / "metrics.jsonl")
    alone = run_alone(cell.cfg, tmp_path / cell.name)
    assert len(here) == len(alone) == 2
    for a, b in zip(here, alone):
      assert a["epsilon"] == b["epsilon"]
      for key in ("test_accuracy", "test_loss", "train_loss"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow   # about a minute
def test_a_sweep_takes_each_datasets_own_task_and_a_loaded_datasets_clients(tmp_path):
  """The audit's findings: a sweep whose variants name other datasets gave every
  program the first one's task, and fedjax_dp.sweep(data=load_dataset(...)) under
  DP refused test_clients (checked against the whole file) and num_clients."""
  from fedjax_dp.data.registry import load_dataset
  from fedjax_dp.data.sample_files import write_sample
  write_sample("shakespeare_tff", str(tmp_path / "sh"), num_clients=6, examples_per_client=4)
  common = {"clients_per_round": 2, "batch_size": 4, "rounds": 1, "eval_every": 1,
            "devices": 1, "local_epochs": 1}
  spec = {"config": common, "variants": [
      {"dataset": "digits", "num_clients": 4, "hidden": [8]},
      {"dataset": "shakespeare_tff", "data_dir": str(tmp_path / "sh"), "model": "char_lstm_seq",
       "partition": "natural_id", "num_clients": 4, "test_clients": 2}]}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "mixed"), progress=False,
                           log=lambda m: None)
  assert len(record["programs"]) == 2
  data = load_dataset("shakespeare_tff", str(tmp_path / "sh"))
  spec = {"config": {**common, **DP, "model": "char_lstm_seq", "partition": "natural_id",
                     "num_clients": 3, "test_clients": 1}, "seeds": 2}
  fedjax_dp.sweep(spec, data=data, out=str(tmp_path / "own"), progress=False,
                  log=lambda m: None)
  rows = read_csv(tmp_path / "own" / "results.csv")
  assert len(rows) == 2 and all(float(r["epsilon"]) > 0 for r in rows)


@pytest.mark.parametrize("partition", ["natural_id", "iid"])
def test_a_config_sweep_refuses_a_dp_cell_tested_on_the_writers_rows_before_any_cell_runs(
    tmp_path, partition):
  """The audit's finding: a sweep from a config (no data=) refused a DP cell whose test
  set is its writers' own held-out rows (FEMNIST's test split, test_clients 0, or a
  pooled partition) only when that cell's program came, after the cells before it had
  run. Now before anything is written; with whole writers held out it runs."""
  from fedjax_dp.data.sample_files import write_sample
  from fedjax_dp.errors import DataError
  write_sample("femnist", str(tmp_path / "data"), num_clients=8, examples_per_client=6)
  config = {"dataset": "femnist", "data_dir": str(tmp_path / "data"), "partition": partition,
            "num_clients": 4, "test_clients": 0, "clients_per_round": 2, "batch_size": 4,
            "rounds": 1, "eval_every": 1, "devices": 1, "hidden": [8]}
  spec = {"config": config, "variants": [{"lr": 0.1}, {"lr": 0.2, **DP}]}
  with pytest.raises(DataError, match=r"^sweep cell '.*lr=0\.2.*': dataset 'femnist' .* with "
                                      "dp 'central': its test split holds held-out examples"):
    fedjax_dp.sweep(spec, out=str(tmp_path / "s"), progress=False, log=lambda m: None)
  assert not (tmp_path / "s").exists()
  with pytest.raises(DataError, match=r"^sweep cell '.*lr=0\.2.*': dataset 'femnist'"):
    load_sweep(spec).cells()   # what fedjax-dp sweep --print-cells checks
  if partition == "natural_id":
    spec["config"]["test_clients"] = 2
    record = fedjax_dp.sweep(spec, out=str(tmp_path / "held"), progress=False,
                             log=lambda m: None)
    assert len(record["cells"]) == 2


def test_the_writers_rows_are_refused_from_the_config_before_any_file_is_read(tmp_path):
  """The refusal needs no data: with no files at data_dir a DP run on FEMNIST's own test
  split (or Stack Overflow pooled, which would read all 135 M posts) says why it is
  refused, not that the files are missing; CIFAR-100's test clients are other people,
  so its DP run is not refused (it then says its files are missing)."""
  from fedjax_dp.errors import DataError
  empty = str(tmp_path / "none")
  os.makedirs(empty)
  for dataset, partition in (("femnist", "natural_id"), ("stackoverflow", "iid")):
    with pytest.raises(DataError, match=f"^dataset '{dataset}' \\(partition {partition}.*with dp "
                                        "'central': its test split holds"):
      fedjax_dp.run({"dataset": dataset, "data_dir": empty, "partition": partition,
                     "num_clients": 4, "clients_per_round": 2, **DP}, out=str(tmp_path / "r"))
  with pytest.raises(DataError, match="^dataset 'cifar100' not found"):
    fedjax_dp.run({"dataset": "cifar100", "data_dir": empty, "partition": "natural_id",
                   "num_clients": 4, "clients_per_round": 2, **DP}, out=str(tmp_path / "c"))
  assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()
