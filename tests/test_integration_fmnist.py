"""A few real rounds on the full Fashion-MNIST from the Debian package, through the CLI."""

import json
import os

import pytest

from fedjax_dp.cli import main
from fedjax_dp.data import DEBIAN_FMNIST

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(DEBIAN_FMNIST, "train-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (make test does)")


def test_fedavg_on_fashion_mnist_learns(tmp_path):
  out = str(tmp_path / "fmnist")
  sets = ["dataset=fmnist", "num_clients=100", "clients_per_round=20", "alpha=0.5",
          "rounds=4", "eval_every=2", "lr=0.05", "momentum=0.5", "batch_size=64"]
  argv = ["run", "--no-progress", "--out", out]
  for kv in sets:
    argv += ["--set", kv]
  assert main(argv) == 0
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  assert [r["round"] for r in rows] == [2, 4]
  # 10 classes: chance is 0.10; four rounds of 20 clients get well past it
  assert rows[-1]["test_accuracy"] > 0.6
  assert rows[-1]["test_loss"] < rows[0]["test_loss"]
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["data"]["train_examples"] == 60000 and summary["data"]["test_examples"] == 10000
  assert summary["model"]["params"] == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def test_datasets_command(capsys, tmp_path):
  assert main(["datasets"]) == 0
  listing = capsys.readouterr().out
  assert "fmnist" in listing and DEBIAN_FMNIST in listing
  png = str(tmp_path / "h.png")
  assert main(["datasets", "--partition", "--set", "dataset=fmnist", "--set", "num_clients=50",
               "--set", "alpha=0.1", "--plot", png]) == 0
  text = capsys.readouterr().out
  assert "50 clients" in text and "client sizes" in text and os.path.getsize(png) > 1000
