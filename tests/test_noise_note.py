"""The DP noise said before the first round (issue 41, finding 1 of the first-hour
review): `fedjax-dp run --config experiments/demo.yaml --set dp=central target_epsilon=1`
calibrated a noise multiplier of 62.7, never printed it, and advised a lower lr when the
model diverged. Now the multiplier, its source and its std on the mean update are one
line, a warning says when that noise is larger than the clip, and the divergence advice
under DP names the noise. Before it, the run's header (finding 10)."""

import json
import os
import re
import subprocess
import sys

import pytest

from fedjax_dp import make_config
from fedjax_dp.experiment import divergence, noise_note

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_console_says_the_calibrated_noise_and_warns_before_round_one(tmp_path):
  out = str(tmp_path / "dp")
  done = subprocess.run(
      [sys.executable, "-m", "fedjax_dp", "run", "--config", "experiments/demo.yaml",
       "--no-progress", "--out", out, "--set", "dp=central", "target_epsilon=1", "rounds=6",
       "eval_every=3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  z = json.load(open(os.path.join(out, "summary.json")))["privacy"]["noise_multiplier"]
  lines = done.stderr.splitlines()
  # the header first (finding 10): what runs, on what, under which mechanism and budget
  assert re.fullmatch(r"fedavg on digits: 20 clients, 10 a round \(fixed\), mlp \(55,210 "
                      r"parameters\), 6 rounds on \d+ cpu devices?; central DP, clip 1, budget "
                      r"epsilon 1 at delta 1e-05", lines[0]), lines[0]
  noise = [line for line in lines if line.startswith("dp central: noise multiplier")]
  assert noise == [f"dp central: noise multiplier {z:.4g} (calibrated to target_epsilon 1 over "
                   f"6 rounds, fixed cohorts of 10 of 20): noise std {z / 10:.3g} x clip_norm "
                   "on the mean update each round"]
  warned = [i for i, line in enumerate(lines) if line.startswith("warning: the noise on the mean")]
  first_round = next(i for i, line in enumerate(lines) if "round" in line and "test" in line)
  assert z / 10 > 1 and warned and warned[0] < first_round


@pytest.mark.parametrize("values,want", [
    ({"dp": "central", "noise_multiplier": 1.0, "clients_per_round": 10}, 0.1),
    ({"dp": "local", "noise_multiplier": 2.0, "clients_per_round": 16, "num_clients": 20}, 0.5),
    ({"dp": "central", "noise_multiplier": 0.0}, None),
    ({}, None)])
def test_the_noise_on_the_mean_update_by_mechanism(values, want):
  """The server's noise on the sum of m clipped uploads: z C / m on the mean; each
  client's own: sqrt(m) z C / m = z C / sqrt(m)."""
  cfg = make_config(values)
  ratio = noise_note.mean_update_ratio(cfg, values.get("noise_multiplier"))
  assert ratio == (None if want is None else pytest.approx(want))
  lines = noise_note.lines(cfg, values.get("noise_multiplier"), calibrated=False)
  assert len(lines) == (0 if want is None else 1)   # small noise: the line, no warning


def test_divergence_advice_under_dp_names_the_noise():
  plain = divergence.message({"round": 5, "what": "test_loss not finite", "last_finite": None},
                             "out")
  assert plain.endswith("(try a lower lr, or clip the updates)")
  dp = divergence.advice(6.27)
  assert dp.startswith("under DP the noise is the likely cause, std 6.27 x clip_norm")
  assert "more clients per round" in dp


def test_the_header_names_the_mechanism_and_its_budget():
  from fedjax_dp.experiment import header
  line = lambda **v: header.line(make_config(v), "mlp", 1234, 2, "cpu", 0)
  assert line() == ("fedavg on digits: 20 clients, 10 a round (fixed), mlp (1,234 parameters), "
                    "50 rounds on 2 cpu devices; no DP")
  assert line(dp="local", noise_multiplier=2.0, target_epsilon=5.0).endswith(
      "; local DP, clip 1, budget epsilon 5 at delta 1e-05")
  assert line(s_local=0.5, kept_noise="multiplier", kept_noise_multiplier=1.0,
              final_clip_l2=1.0, index_selection="random_k").endswith(
      "; no user-level DP; kept noise 'multiplier' on the uploads' kept coordinates")
  resumed = header.line(make_config({"rounds": 60}), "mlp", 10, 1, "gpu", 20)
  assert "rounds 20 to 60 on 1 gpu device;" in resumed
