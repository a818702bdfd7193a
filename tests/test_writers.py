"""Live metrics writers (experiment/writers.py, callbacks.log_metrics): CSV and
TensorBoard hold what metrics.jsonl holds, read back independently (the csv module;
the TFRecord framing and the Event protobuf by hand), also across a resume."""

import csv
import glob
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dp.experiment import writers

FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
FAST = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
        "batch_size=16", "lr=0.05", "eval_every=2", "devices=1", "checkpoint_every=2"]


def fedjax_dp(*args):
  return subprocess.run([FEDJAX_DP, *args], capture_output=True, text=True, timeout=300)


def jsonl(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def read_csv(out):
  with open(os.path.join(out, "metrics.csv")) as f:
    return list(csv.DictReader(f))


def tensorboard_scalars(out) -> dict:
  """{(tag, step): value} from every event file, by TFRecord framing and Event protos."""
  from tensorboardX.proto import event_pb2
  found = {}
  for path in sorted(glob.glob(os.path.join(out, "tensorboard", "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for v in event.summary.value:
        found[(v.tag, event.step)] = v.simple_value
  return found


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_csv_and_tensorboard_hold_the_rows_also_across_a_resume(tmp_path):
  out = str(tmp_path / "run")
  done = fedjax_dp("run", "--no-progress", "--out", out, "--set", *FAST, "rounds=4",
                   "--log", "csv", "tensorboard")
  assert done.returncode == 0, done.stderr[-2000:]
  done = fedjax_dp("run", "--no-progress", "--resume", "--out", out, "--set", "rounds=6",
                   "--log", "csv", "tensorboard")
  assert done.returncode == 0, done.stderr[-2000:]
  rows = jsonl(out)
  assert [r["round"] for r in rows] == [2, 4, 6]
  table = read_csv(out)
  assert len(table) == len(rows)
  for line, row in zip(table, rows):
    for key, value in row.items():
      cell = line[key]
      assert (cell == "" if value is None else float(cell) == value), (key, cell, value)
  scalars = tensorboard_scalars(out)
  for row in rows:
    for key in ("test_accuracy", "test_loss", "train_loss", "bytes_up"):
      assert scalars[(key, row["round"])] == np.float32(row[key]), key
  assert ("epsilon", 2) not in scalars   # null: not a scalar


def test_the_csv_header_grows_with_new_keys(tmp_path):
  w = writers.csv(str(tmp_path))
  w.start([{"round": 1, "test_loss": 1.5}])
  w.write({"round": 2, "test_loss": None, "nonfinite": ["test_loss"]})
  w.close()
  with open(tmp_path / "metrics.csv") as f:
    assert f.read() == "round,test_loss,nonfinite\n1,1.5,\n2,,test_loss\n"


def test_log_refusals_are_one_line(tmp_path):
  done = fedjax_dp("run", "--out", str(tmp_path / "r"), "--log", "wandb")
  assert done.returncode == 2 and "argument --log: invalid choice: 'wandb'" in done.stderr
  done = fedjax_dp("run", "--print-config", "--log", "csv")
  assert done.returncode == 2 and done.stderr == (
      "error: --log csv with --print-config: nothing runs, so nothing would be logged\n")
