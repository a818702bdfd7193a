"""TopkSDP-FL's kept noise as a mechanism module (issue 40, item 4): the config's
mode strings (`dp`, `kept_noise`) are read only where the config becomes a
recipe, and a calibration registered from a plugin runs through the CLI with its
own noise and its own report, checked against dp-accounting."""

import json
import os
import re

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fedjax_dp
from fedjax_dp.cli import main
from fedjax_dp.compression import pipeline as pl
from fedjax_dp.privacy import mechanisms
from fedjax_dp.recipes import flat
from tests.helpers import registries_restored

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a comparison of a mechanism's mode string: cfg.dp == ..., c.kept_noise != ...,
# v["kept_noise"] == ..., privacy.get("dp") != ...
MODE_COMPARISON = re.compile(
    r"""(\.(dp|kept_noise)|\[["'](dp|kept_noise)["']\]|\.get\(["'](dp|kept_noise)["']\))"""
    r"""\s*(==|!=|not\s+in\b|in\b)""")
# where the config is read as a recipe (recipes/flat.kept_noise_of, the names' check),
# and the CLI's last line, which reads a written summary
EDGE = ("fedjax_dp/recipes/flat.py", "fedjax_dp/recipes/config_checks.py",
        "fedjax_dp/cli/commands.py")


def _mode_comparisons() -> list[str]:
  found = []
  for folder, _, files in os.walk(os.path.join(ROOT, "fedjax_dp")):
    for name in files:
      path = os.path.join(folder, name)
      rel = os.path.relpath(path, ROOT)
      if not name.endswith(".py") or rel in EDGE:
        continue
      for i, line in enumerate(open(path), 1):
        if MODE_COMPARISON.search(line.split("#")[0]):
          found.append(f"{rel}:{i}: {line.strip()}")
  return found


def test_mode_strings_are_compared_only_at_the_edge():
  assert _mode_comparisons() == []


@pytest.mark.parametrize("line", [
    'if cfg.kept_noise == "paper":', "x = c.dp != 'none'", 'if v["kept_noise"] != "none":',
    'privacy.get("dp") != "none"', "if cfg.dp in ('central', 'local'):"])
def test_the_mode_scan_finds_a_comparison(line):
  """Not vacuous: each spelling of a comparison is found."""
  assert MODE_COMPARISON.search(line)


TWICE = '''
from fedjax_dp.privacy.mechanisms import register_kept_noise
from fedjax_dp.privacy.mechanisms.kept_noise import KeptNoise, noise_on_kept


def _stage(s, clip, sparsity, draw):
  return noise_on_kept(2 * s["kept_noise_multiplier"] * clip, draw)


def _std(s, clip, k, lr, n):
  return 2 * s["kept_noise_multiplier"] * clip


register_kept_noise(KeptNoise("twice", _stage, _std, "2 z C"))
'''

RUN = {"dataset": "digits", "num_clients": 10, "clients_per_round": 5, "sampling": "fixed",
       "hidden": [16], "batch_size": 16, "lr": 0.05, "rounds": 3, "eval_every": 3,
       "devices": 1, "algorithm": "topksdp", "s_local": 0.9, "index_selection": "random_k",
       "final_clip_l2": 0.5, "kept_noise": "twice", "kept_noise_multiplier": 1.5,
       "ldp_delta": 1e-5}


@pytest.fixture
def twice(tmp_path):
  (tmp_path / "twice.py").write_text(TWICE)
  with registries_restored():
    yield str(tmp_path / "twice.py")


def test_a_registered_calibration_draws_its_own_noise(twice):
  """The recipe's kept-noise stage is the plugin's: N(0, (2 z C)^2) on the kept
  coordinates only (KS test), nothing elsewhere."""
  cfg = fedjax_dp.make_config({**RUN, "plugins": [twice], "kept_noise_draw": "client"})
  assert flat.kept_noise_of(cfg) is mechanisms.KEPT_NOISE["twice"]
  stage = fedjax_dp.recipes.from_config(cfg).client_pipeline()
  d = 20_000
  u = pl.Upload(jnp.zeros(d, jnp.float32), jnp.ones(d, bool))
  ctx = pl.StageContext(jax.random.PRNGKey(3), jnp.int32(50), jnp.float32(0.05), jnp.zeros(d))
  out, _, _ = stage.update(u, stage.init(d), ctx)
  values, sent = np.asarray(out.values), np.asarray(out.sent)
  assert sent.sum() == pl.keep_count(d, 0.9) and np.all(values[~sent] == 0)
  assert stats.kstest(values[sent] / (2 * 1.5 * 0.5), "norm").pvalue > 1e-3


def test_a_registered_calibration_runs_from_the_cli_with_its_epsilon(twice, tmp_path):
  """Its report: the std 2 z C_f, and the accountant's per-client epsilon of a
  Gaussian of multiplier std / (2 C_f) over every round, as dp-accounting composes it."""
  out = str(tmp_path / "run")
  sets = [f"{k}={json.dumps(v) if isinstance(v, list) else v}"
          for k, v in {**RUN, "plugins": [twice]}.items()]
  assert main(["run", "--no-progress", "--out", out, "--set", *sets]) == 0
  kept = json.load(open(os.path.join(out, "summary.json")))["privacy"]["kept_noise"]
  std = 2 * 1.5 * 0.5
  assert kept["noise_std"]["min_over_clients"] == pytest.approx(std)
  assert kept["noise_std"]["max_over_clients"] == pytest.approx(std)
  assert "papers_chain" not in kept and "size_leak" not in kept
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(dp_accounting.GaussianDpEvent(std / (2 * 0.5)), RUN["rounds"])
  want = accountant.get_epsilon(1e-5)
  assert kept["accountant"]["epsilon"] == pytest.approx(want, rel=2e-2)


def test_an_unregistered_calibration_is_one_line(capsys, tmp_path):
  out = str(tmp_path / "run")
  assert main(["run", "--no-progress", "--out", out, "--set", "kept_noise=halved"]) == 2
  assert not os.path.exists(os.path.join(out, "summary.json"))
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0
  assert "kept_noise' = 'halved'" in err and "none, paper, multiplier" in err


def test_register_kept_noise_refuses_none_and_a_taken_name():
  with registries_restored():
    taken = mechanisms.KEPT_NOISE["paper"]._replace(follows_lr=False)
    with pytest.raises(ValueError, match="already registered"):
      mechanisms.register_kept_noise(taken)
    with pytest.raises(ValueError, match="already registered"):
      mechanisms.register_kept_noise(taken._replace(name="none"))
    mechanisms.register_kept_noise(mechanisms.KEPT_NOISE["paper"])   # the same bundle again
