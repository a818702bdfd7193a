"""A run that diverges: no bare NaN in metrics.jsonl or summary.json, a stop with one
line and exit status 3 (through the console script), no checkpoint of the
non-finite state, and the warning of a loss that grew tenfold."""

import json
import math
import os
import subprocess
import sys

import pytest


from fedjax_dp.experiment import checkpoint
from fedjax_dp.experiment import divergence as div

FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")


def strict_json(text: str):
  """json.loads that refuses NaN and Infinity, as most parsers outside Python do."""
  def refuse(token):
    raise ValueError(f"bare {token} in JSON")
  return json.loads(text, parse_constant=refuse)


def test_a_non_finite_figure_is_null_and_flagged():
  row = {"round": 5, "test_accuracy": 0.1, "test_loss": math.nan, "train_loss": math.inf,
         "epsilon": None}
  assert div.finite_row(row) == {"round": 5, "test_accuracy": 0.1, "test_loss": None,
                                 "train_loss": None, "epsilon": None,
                                 "nonfinite": ["test_loss", "train_loss"]}
  assert div.finite_row({"round": 1, "x": 2.0}) == {"round": 1, "x": 2.0}
  assert div.json_safe({"a": [1.0, -math.inf, {"b": math.nan}], "c": (2, "s")}) == \
      {"a": [1.0, None, {"b": None}], "c": [2, "s"]}
  assert not div.row_is_finite(div.finite_row(row))
  assert div.row_is_finite(div.finite_row({"round": 1, "test_loss": 1.0,
                                           "train_loss": math.nan}))


def test_the_loss_growth_warning_against_the_lowest_loss_before():
  rows = [{"round": 2, "train_loss": 2.0}, {"round": 4, "train_loss": 0.5},
          {"round": 6, "train_loss": 4.9}]
  assert div.loss_growth(rows) is None                        # 9.8x the lowest, 0.5
  rows[-1]["train_loss"] = 5.0
  assert div.loss_growth(rows).startswith("train loss 5 at round 6 is 10x its lowest "
                                          "(0.5, round 4)")
  # the first evaluation, against the untrained model's test loss
  first = [{"round": 5, "train_loss": 9.5e14}]
  assert div.loss_growth(first) is None
  assert "its lowest (2.3, the untrained model's test loss)" in div.loss_growth(first, 2.3)
  # no train loss (SOLO, a diverged cohort): the test loss
  assert div.loss_growth([{"round": 1, "test_loss": 1.0, "train_loss": None},
                          {"round": 2, "test_loss": 11.0, "train_loss": None}]).startswith(
                              "test loss 11 at round 2 is 11x")


def test_the_message_names_the_round_and_the_last_finite_evaluation():
  rows = [{"round": 2, "test_accuracy": 0.5, "test_loss": 1.25, "train_loss": 1.5},
          {"round": 4, "test_accuracy": 0.1, "test_loss": None, "nonfinite": ["test_loss"]}]
  d = div.report(4, "test_loss not finite", rows)
  assert d["last_finite"] == {"round": 2, "test_accuracy": 0.5, "test_loss": 1.25,
                              "train_loss": 1.5}
  assert div.message(d, "/r") == (
      "the run diverged at round 4: test_loss not finite; last finite evaluation: round 2: "
      "test accuracy 0.5, test loss 1.25, train loss 1.5; outputs up to round 4 are in /r "
      "(try a lower lr, or clip the updates)")
  assert "last finite evaluation: none" in div.message(div.report(2, "x", rows[1:]), "/r")


# Byzantine clients that scale their updates by 1e12: the model's test loss stops being
# finite after a round or more
DIVERGING = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
             "batch_size=16", "lr=0.05", "rounds=8", "eval_every=1", "devices=1",
             "byzantine_fraction=0.2", "byzantine_attack=scaled", "byzantine_scale=1e12",
             "checkpoint_every=1"]


@pytest.mark.slow   # ~13 s: make test-slow, so make test stays under 10 minutes
def test_a_diverged_run_stops_with_one_line_and_exit_three(tmp_path):
  out = str(tmp_path / "run")
  done = subprocess.run([FEDJAX_DP, "run", "--no-progress", "--out", out, "--set", *DIVERGING],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == div.DIVERGED, done.stderr[-2000:]
  with open(os.path.join(out, "summary.json")) as f:
    summary = strict_json(f.read())
  # the round it diverges at follows the run's draws (its release's run key): at
  # least one evaluation is finite before it
  r = summary["diverged"]["round"]
  assert 2 <= r < 8 and summary["diverged"]["last_finite"]["round"] == r - 1
  lines = done.stderr.strip().splitlines()
  assert lines[-1].startswith(f"error: the run diverged at round {r}: test_loss not finite; "
                              f"last finite evaluation: round {r - 1}: test accuracy "), lines
  assert lines[-1].endswith(f"outputs up to round {r} are in {os.path.abspath(out)} (try a "
                            "lower lr, or clip the updates)")
  assert done.stdout == ""
  with open(os.path.join(out, "metrics.jsonl")) as f:
    rows = [strict_json(line) for line in f]
  assert [row["round"] for row in rows] == list(range(1, r + 1))
  assert rows[-1]["test_loss"] is None and "test_loss" in rows[-1]["nonfinite"]
  assert all("nonfinite" not in row for row in rows[:-1])
  assert summary["rounds"] == r and summary["final"]["round"] == r
  # the non-finite state is not checkpointed: it would push out the good ones
  assert checkpoint.steps(os.path.join(out, "checkpoints"))[-1] == r - 1


def test_a_model_that_is_not_finite_stops_the_python_api_run_too(tmp_path):
  from fedjax_dp import run
  summary = run("fedavg", out=str(tmp_path / "r"), progress=False, log=lambda m: None,
                dataset="digits", num_clients=10, clients_per_round=5, hidden=(200, 200),
                batch_size=16, local_epochs=2, lr=50.0, rounds=6, eval_every=2, devices=1)
  assert summary["diverged"]["round"] == 2
  assert summary["diverged"]["what"] == ("the global model is not finite after round 2 (the "
                                         "training loss was first not finite at round 1)")
  assert summary["final"]["nonfinite"] == ["test_loss", "train_loss"]
  assert summary["best_test_accuracy"] is not None
