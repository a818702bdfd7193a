"""experiments/adversarial/run.py (Table 5): every cell it asks for is a valid run,
the central-DP arm refuses exactly what the library refuses, the tables' means
and divergence counts by hand, and (slow) the whole script end to end."""

import argparse
import os
import subprocess
import sys

import pytest

from tests.helpers import experiment_script, one_device_env

ROOT = os.path.join(os.path.dirname(__file__), "..")
RUN = experiment_script("adversarial")


def _args(**kw):
  values = dict(dataset="healthcare", seeds=[0, 1], attacks=list(RUN.ATTACKS),
                defenses=list(RUN.DEFENSES), fractions=list(RUN.FRACTIONS), rounds=0,
                grid="full", out="unused", overwrite=False)
  values.update(kw)
  return argparse.Namespace(**values)


@pytest.mark.parametrize("dataset", ["healthcare", "fmnist"])
def test_every_cell_of_every_kind_is_a_valid_run(dataset):
  from fedjax_dp.sweeps import load_sweep
  args = _args(dataset=dataset, seeds=[0])
  proto = RUN.protocol(args)
  counts = {}
  for kind in ("robustness", "dp", "inference"):
    spec, refused = RUN.sweep_spec(kind, args, proto)
    cells = load_sweep(spec).cells()          # make_config of each: refusals raise here
    counts[kind] = (len(cells), len(refused))
  # robustness: the clean row and 7 attacks x 3 fractions, each against 7 defenses
  assert counts["robustness"] == ((1 + 7 * 3) * 7, 0)
  # central DP: mean and norm bound against the clean row and 5 attacks x 3 fractions;
  # refused: the 5 robust rules on every row, ALIE and IPM under the 2 others
  assert counts["dp"] == ((1 + 5 * 3) * 2, (1 + 7 * 3) * 5 + 2 * 3 * 2)
  assert counts["inference"] == (2, 0)


def test_the_paper_grid_pairs_each_attack_with_its_table5_defense():
  args = _args(grid="paper")
  spec, _ = RUN.sweep_spec("robustness", args, RUN.protocol(args))
  pairs = {(v.get("byzantine_attack", "none"), v.get("byzantine_fraction", 0.0),
            "norm_bound" if "server_clip_l2" in v else v["aggregator"]) for v in spec["variants"]}
  # the clean row under the 6 defenses used; 7 attacks x 3 fractions x (none, paired)
  assert len(spec["variants"]) == len(pairs) == 6 + 7 * 3 * 2
  assert {("gaussian", 0.1, "median"), ("ipm", 0.2, "trimmed_mean"), ("alie", 0.3, "krum"),
          ("backdoor", 0.2, "filtered_mean"), ("targeted", 0.3, "norm_bound"),
          ("label_flip", 0.1, "median"), ("sign_flip", 0.3, "mean")} <= pairs
  assert ("gaussian", 0.1, "krum") not in pairs


def test_the_dp_arm_refuses_with_the_librarys_reasons():
  args = _args()
  _, refused = RUN.sweep_spec("dp", args, RUN.protocol(args))
  reasons = {(r["attack"], r["defense"]): r["refused"] for r in refused}
  assert "the server noise is calibrated to a sum" in reasons[("none", "median")]
  assert "the colluders read the other clients' uploads" in reasons[("alie", "mean")]
  assert ("gaussian", "mean") not in reasons and ("backdoor", "norm_bound") not in reasons


def test_defenses_are_the_same_at_every_fraction():
  proto = RUN.protocol(_args())
  assert RUN.defense_keys("krum", proto) == {"aggregator": "krum", "byzantine_f": 4}  # 30 % of 12
  assert RUN.defense_keys("norm_bound", proto) == {"server_clip_l2": 0.1}   # the DP clip
  assert RUN.attack_keys("ipm", 0.2)["byzantine_scale"] == 0.5


def _row(attack, defense, seed, acc, metric=None, diverged=False):
  return {"attack": attack, "fraction": 0.2 if attack != "none" else 0.0, "defense": defense,
          "seed": seed, "diverged": diverged, "test_accuracy": None if diverged else acc,
          "attack_metric": metric, "epsilon": None}


def test_settings_average_the_finite_seeds_and_count_the_diverged():
  rows = [_row("none", "mean", 0, 0.8), _row("none", "mean", 1, 0.7),
          _row("gaussian", "mean", 0, None, diverged=True), _row("gaussian", "mean", 1, 0.3),
          _row("backdoor", "median", 0, 0.6, 0.9), _row("backdoor", "median", 1, 0.5, 0.5)]
  table = {(s["attack"], s["defense"]): s for s in RUN.settings(rows)}
  clean = table[("none", "mean")]
  assert clean["test_accuracy_mean"] == pytest.approx(0.75)
  assert clean["test_accuracy_sd"] == pytest.approx(0.0707107, rel=1e-5)
  gauss = table[("gaussian", "mean")]
  assert gauss["diverged"] == 1 and gauss["test_accuracy_mean"] == pytest.approx(0.3)
  assert gauss["test_accuracy_sd"] is None
  assert RUN._cell_text(gauss, clean) == "30.0 (-45.0); diverged 1/2"
  bd = table[("backdoor", "median")]
  assert RUN._cell_text(bd, clean) == "55.0 +- 7.1 (-20.0); ASR 70.0"


def test_bad_requests_are_one_line_errors(tmp_path, capsys):
  for argv, says in ((["dp", "--fractions", "0.6"], "--fractions 0.6"),
                     (["dp", "--defenses", "median"], "'mean' (no defense) must be"),
                     (["dp", "--seeds", "1", "1"], "each value at most once")):
    with pytest.raises(SystemExit) as e:
      RUN.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow   # ~1 minute: make test-slow (CI runs it)
def test_table5_end_to_end_on_the_healthcare_protocol_and_reuse(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "adversarial", "run.py"), "table5",
         "--dataset", "healthcare", "--seeds", "0", "--rounds", "3", "--attacks", "gaussian",
         "backdoor", "targeted", "--defenses", "mean", "median", "norm_bound", "--fractions",
         "0.2", "--out", str(tmp_path)]
  env = one_device_env()
  first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert first.returncode == 0, first.stderr[-2000:]
  root = tmp_path / "healthcare"
  for name in ("robustness", "dp", "inference"):
    assert (root / f"{name}.md").exists() and (root / f"{name}.csv").exists()
  table5 = (root / "table5.md").read_text()
  assert "-1.2% / Yes" in table5 and "51.2% success" in table5   # the paper's, beside ours
  assert "diverged" in (root / "robustness.md").read_text() or "ASR" in table5
  dp = (root / "dp.md").read_text()
  assert "Refused under central DP" in dp and "Accounted epsilon at the end" in dp
  summary = next((root / "robustness" / "cells").glob("*/summary.json"))
  before = summary.stat().st_mtime_ns
  second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert second.returncode == 0, second.stderr[-2000:]
  assert summary.stat().st_mtime_ns == before      # finished cells are kept
