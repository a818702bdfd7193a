"""Attribute inference (adversary/attribute.py, `fedjax-dp attack attribute`): the
candidates and bins, a model whose label is the column (the attack must find it),
and the command on a healthcare run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fedjax_dp
from fedjax_dp.adversary import attribute


def test_candidates_are_the_values_or_quantile_bins():
  col = np.array([2.0, 0.0, 1.0, 2.0, 2.0, 1.0], np.float32)
  values, which, prior = attribute.candidates(col)
  np.testing.assert_array_equal(values, [0.0, 1.0, 2.0])
  np.testing.assert_array_equal(which, [2, 0, 1, 2, 2, 1])
  np.testing.assert_allclose(prior, [1 / 6, 2 / 6, 3 / 6])
  col = np.arange(100, dtype=np.float32)
  values, which, prior = attribute.candidates(col, max_values=10, bins=4)
  np.testing.assert_allclose(values, [12.0, 37.0, 62.0, 87.0])    # each quarter's median
  np.testing.assert_array_equal(np.bincount(which), [25, 25, 25, 25])
  np.testing.assert_allclose(prior, 0.25)


def test_a_model_that_reads_the_column_gives_it_away():
  """Label = column 0 (0 or 1) and a model whose logits are (-5 x0, 5 x0): the loss
  on the true label is smallest at the true value, for every row."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 3)).astype(np.float32)
  x[:, 0] = rng.integers(0, 2, 200)
  y = x[:, 0].astype(np.int32)
  apply = lambda p, xb: xb[:, :1] * p["w"]
  params = {"w": np.array([[-5.0, 5.0]], np.float32)}
  report = attribute.attribute_attack(apply, params, x[:100], y[:100], x[100:], y[100:], 0)
  assert report["members_success"] == report["nonmembers_success"] == 1.0
  assert report["baseline_success"] == pytest.approx(np.mean(x[:100, 0] == 1) if
                                                     np.mean(x[:100, 0]) >= 0.5 else
                                                     np.mean(x[:100, 0] == 0))
  # a model that ignores the column: the prior decides, the most common value each time
  blind = attribute.attribute_attack(lambda p, xb: xb[:, 1:3] * 0.0, params, x[:100], y[:100],
                                     x[100:], y[100:], 0)
  assert blind["members_success"] == pytest.approx(blind["baseline_success"])


def cli(*args):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, "attack", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_cli_attacks_a_healthcare_run_and_refuses_what_it_cannot(tmp_path):
  run = tmp_path / "hc"
  fedjax_dp.run({"dataset": "healthcare", "healthcare_examples": 400, "rounds": 2,
                 "eval_every": 2}, out=str(run), progress=False, log=lambda m: None)
  done = cli("attribute", "--run", str(run), "--json", str(tmp_path / "a.json"))
  assert done.returncode == 0, done.stderr
  assert "attribute inference of 'demo_ethnicity' (5 values)" in done.stdout
  report = json.loads((tmp_path / "a.json").read_text())
  assert report == fedjax_dp.attack_attribute(str(run)) | {"run": report["run"]}
  age = cli("attribute", "--run", str(run), "--feature", "demo_age")
  assert age.returncode == 0 and "(4 quantile bins)" in age.stdout
  bad = cli("attribute", "--run", str(run), "--feature", "height")
  assert bad.returncode == 2 and "--feature 'height': dataset" in bad.stderr
  digits = tmp_path / "digits"
  fedjax_dp.run({"dataset": "digits", "rounds": 1, "eval_every": 1}, out=str(digits),
                progress=False, log=lambda m: None)
  images = cli("attribute", "--run", str(digits))
  assert images.returncode == 2 and "reads a column of tabular data" in images.stderr
