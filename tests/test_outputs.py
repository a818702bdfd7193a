"""What a run leaves that people expect: the trained model, loadable in one call;
the partition plot in class names."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import make_config
from fedjax_dp.errors import RunError

FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
FAST = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
        "batch_size=16", "lr=0.05", "rounds=4", "eval_every=2", "devices=1"]


def test_the_trained_model_is_saved_and_loads_in_one_call(tmp_path):
  out = str(tmp_path / "run")
  done = subprocess.run([FEDJAX_DP, "run", "--no-progress", "--out", out, "--set", *FAST],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert f"model:   {out}/model.msgpack (fedjax_dp.load_params)" in done.stdout
  params = fedjax_dp.load_params(out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = make_config(json.load(f), refuse_unread=False)
  with open(os.path.join(out, "summary.json")) as f:
    final = json.load(f)["final"]
  # the saved parameters evaluate to the run's last test figures
  sim = fedjax_dp.simulate(cfg)
  metrics = sim.evaluate(params, *sim.test_data)
  assert float(metrics["accuracy"]) == final["test_accuracy"]
  assert float(metrics["loss"]) == final["test_loss"]


def test_solo_saves_every_clients_model_and_a_missing_model_is_one_line(tmp_path):
  out = str(tmp_path / "solo")
  fedjax_dp.run("solo", out=out, progress=False, log=lambda m: None, rounds=2, eval_every=2,
                dataset="digits", num_clients=6, clients_per_round=3, hidden=(8,), devices=1)
  models = fedjax_dp.load_params(out)["client_models"]
  leaves = [np.asarray(x) for x in jax.tree.leaves(models)]
  assert leaves and all(x.shape[0] == 6 for x in leaves)
  os.remove(os.path.join(out, "model.msgpack"))
  with pytest.raises(RunError, match=f"{out} holds no model.msgpack: it is not a finished run"):
    fedjax_dp.load_params(out)


def test_the_partition_plot_names_the_classes(tmp_path):
  from fedjax_dp.data import partition
  from fedjax_dp.data.registry import class_names
  hist = np.array([[3, 1], [0, 4]])
  labels = partition.plot_histogram(hist, str(tmp_path / "p.png"),
                                    class_names=class_names("breast_cancer"))
  assert labels == ["malignant", "benign"] and os.path.getsize(tmp_path / "p.png") > 0
  assert partition.plot_histogram(hist, str(tmp_path / "q.png")) == ["0", "1"]
  assert len(class_names("fmnist")) == len(class_names("cifar10")) == 10


def test_a_data_attacks_success_gets_its_own_plot(tmp_path, monkeypatch):
  """attack.png: the attack's metric and the main accuracy against rounds, only
  where metrics.jsonl has an attack metric."""
  import matplotlib.axes
  from fedjax_dp.experiment import reporting
  drawn = {}
  real_plot = matplotlib.axes.Axes.plot

  def spy(ax, *args, label=None, **kw):
    drawn.setdefault(ax.figure, []).append((label, list(args[1]) if len(args) > 1 else None))
    return real_plot(ax, *args, label=label, **kw)
  monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
  rows = [{"round": r, "test_accuracy": 0.5 + r / 100, "test_loss": 1.0, "train_loss": 1.0,
           "attack_success_rate": r / 10, "bytes_up": 1, "bytes_down": 1} for r in (1, 2, 3)]
  paths = reporting.plot_metrics(rows, str(tmp_path))
  assert str(tmp_path / "attack.png") in paths and (tmp_path / "attack.png").exists()
  series = drawn[list(drawn)[-1]]       # the last figure made: attack.png
  assert series == [("attack success rate", [0.1, 0.2, 0.3]),
                    ("test accuracy (main task)", [0.51, 0.52, 0.53])]
  clean = [{k: v for k, v in r.items() if k != "attack_success_rate"} for r in rows]
  (tmp_path / "clean").mkdir()
  assert not any(p.endswith("attack.png")
                 for p in reporting.plot_metrics(clean, str(tmp_path / "clean")))
