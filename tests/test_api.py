"""fedjax_dp.run and fedjax_dp.simulate: recipes, your model, loss and data, and the
package's public names."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp.api import recipe_config
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError, RunError
from fedjax_dp.experiment.reports.privacy_report import privacy_report

ROOT = os.path.join(os.path.dirname(__file__), "..")


class Classifier(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.tanh(nn.Dense(8)(x)))


def blobs(clients=5, n=12, seed=0, test=0):
  """Three Gaussian classes in 4-D, n rows per client, int labels. test > 0: that many
  more rows, no client's, as test=(x, y) (a run under DP refuses the default holdout
  of the clients' own rows); else a quarter of each client's rows."""
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(3, 4)) * 2
  y = rng.integers(0, 3, size=clients * n + test)
  x = (means[y] + rng.normal(size=(len(y), 4))).astype(np.float32)
  m = clients * n
  if test:
    return fedjax_dp.data.from_arrays(x[:m], y[:m], client_ids=np.arange(m) % clients,
                                      test=(x[m:], y[m:]), name="blobs")
  return fedjax_dp.data.from_arrays(x, y, client_ids=np.arange(len(y)) % clients,
                                    test_fraction=0.25, seed=seed, name="blobs")


def test_import_is_cheap_and_exposes_the_public_names():
  code = ("import sys, fedjax_dp; assert 'jax' not in sys.modules, 'jax imported'; "
          "names = ['run', 'simulate', 'models', 'data', 'losses', 'callbacks', 'Config', "
          "'make_config', 'ConfigError', 'DataError', 'RunError']; "
          "assert set(names) <= set(dir(fedjax_dp)); "
          "[getattr(fedjax_dp, n) for n in names]; "
          "from fedjax_dp import run, simulate, losses; "
          "print(fedjax_dp.models.from_flax.__name__, fedjax_dp.data.from_arrays.__name__)")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ["from_flax", "from_arrays"]
  assert fedjax_dp.__doc__.count("run(") >= 1
  with pytest.raises(AttributeError, match="has no attribute 'nope'"):
    fedjax_dp.nope


def test_recipes_are_names_dicts_or_configs():
  assert recipe_config("fedprox").algorithm == "fedprox"
  cfg = recipe_config("dp_fedavg", noise_multiplier=1.0)
  assert (cfg.algorithm, cfg.dp, cfg.noise_multiplier) == ("fedavg", "central", 1.0)
  assert recipe_config({"algorithm": "scaffold", "rounds": 7}, rounds=9).rounds == 9
  base = make_config({"algorithm": "moon", "lr": 0.3})
  assert recipe_config(base, rounds=3) == make_config({"algorithm": "moon", "lr": 0.3,
                                                       "rounds": 3})
  ds = blobs(clients=4)
  own = recipe_config("fedavg", data=ds)
  assert (own.dataset, own.num_clients, own.clients_per_round) == ("custom", 4, 4)
  assert recipe_config("fedavg", data=blobs(clients=12)).clients_per_round == 10
  for call, message in (
      (lambda: recipe_config(3), "recipe of type int: allowed are an algorithm name"),
      (lambda: recipe_config("fedfoo"), "config key 'algorithm' = 'fedfoo'"),
      (lambda: recipe_config("dp_fedavg"), "dp 'central' needs noise_multiplier"),
      (lambda: recipe_config("fedavg", data=ds, num_clients=5),
       "config key 'num_clients' = 5: your data has 4 clients"),
      (lambda: recipe_config("fedavg", data=ds, dataset="digits"),
       "config key 'dataset' = 'digits' with your own dataset 'blobs'"),
      (lambda: recipe_config("fedavg", feature_scaling="pooled", data=ds),
       "feature_scaling' = 'pooled' with dataset 'custom'")):
    with pytest.raises(ConfigError, match=message) as e:
      call()
    assert "\n" not in str(e.value)


def test_simulate_evaluates_your_classifier_as_numpy_does():
  ds = blobs()
  model = fedjax_dp.models.from_flax(Classifier(), ds.x_train[:1], name="clf")
  sim = fedjax_dp.simulate("fedavg", model=model, data=ds, lr=0.1, batch_size=8, devices=1)
  state, _ = sim.run_rounds(sim.init_state(), 3)
  got = sim.evaluate(state.params, *sim.test_data)
  # plain Python floats in the task's order (the first-hour review: JAX arrays printed)
  assert list(got) == ["accuracy", "loss"] and all(type(v) is float for v in got.values())
  logits = np.asarray(Classifier().apply({"params": state.params}, ds.x_test), np.float64)
  z = logits - logits.max(1, keepdims=True)
  ce = np.log(np.exp(z).sum(1)) - z[np.arange(len(z)), ds.y_test]
  np.testing.assert_allclose(got["accuracy"], np.mean(logits.argmax(1) == ds.y_test), rtol=1e-6)
  np.testing.assert_allclose(got["loss"], ce.mean(), rtol=1e-5)


def test_simulate_with_central_dp_gives_a_privacy_report():
  ds = blobs(test=15)
  model = fedjax_dp.models.from_flax(Classifier(), ds.x_train[:1])
  sim = fedjax_dp.simulate("dp_fedavg", model=model, data=ds, noise_multiplier=2.0, delta=1e-3,
                           rounds=4, devices=1)
  state, _ = sim.run_rounds(sim.init_state(), 4)
  report = privacy_report(sim.cfg, sim, state)
  assert report["dp"] == "central" and report["rounds_accounted"] == 4
  assert 0 < report["epsilon"] < 50


def test_run_with_your_own_loss_and_classifier_writes_the_clis_outputs(tmp_path):
  ds = blobs()
  model = fedjax_dp.models.from_flax(Classifier(), ds.x_train[:1], name="clf")
  out = str(tmp_path / "run")
  summary = fedjax_dp.run("fedavg", model=model, data=ds, rounds=4, out=out, progress=False,
                          eval_every=2, lr=0.1, batch_size=8, devices=1)
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  assert [r["round"] for r in rows] == [2, 4]
  assert list(rows[0])[:3] == ["round", "test_accuracy", "test_loss"]
  assert summary["best_test_accuracy"] == max(r["test_accuracy"] for r in rows)
  assert summary["inputs"]["loss"]["name"] == "classification"
  for f in ("config.json", "summary.json", "inputs.json", "accuracy.png", "loss.png"):
    assert os.path.exists(os.path.join(out, f)), f
  # never overwritten: refused before anything is touched, unless overwrite
  before = open(os.path.join(out, "metrics.jsonl")).read()
  with pytest.raises(RunError, match=r"is not empty: pass --overwrite \(Python: overwrite=True\)"):
    fedjax_dp.run("fedavg", model=model, data=ds, rounds=4, out=out, progress=False,
                  eval_every=2, lr=0.1, batch_size=8, devices=1)
  assert open(os.path.join(out, "metrics.jsonl")).read() == before

  def half_sq(o, t, m):   # a loss of your own: 1/2 squared error of the first logit
    return fedjax_dp.losses.masked_mean(0.5 * (o[:, 0] - t) ** 2, m)
  reg = fedjax_dp.data.from_arrays(ds.x_train, ds.y_train.astype(np.float32),
                                   partition=list(ds.client_parts),
                                   test=(ds.x_test, ds.y_test.astype(np.float32)))
  summary = fedjax_dp.run("fedprox", model=model, data=reg, loss=half_sq, rounds=2, out=out,
                          overwrite=True, progress=False, eval_every=2, devices=1)
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  assert len(rows) == 1 and "test_accuracy" not in rows[0] and rows[0]["test_loss"] > 0
  loss = dict(summary["inputs"]["loss"])
  assert len(loss.pop("sha256")) == 64      # the traced loss's digest (tells lambdas apart)
  assert loss == {"name": "half_sq", "target_dtype": None, "metrics": ["loss"]}


def test_a_config_recipe_that_names_other_data_or_clients_is_refused():
  """A Config recipe carries dataset and num_clients: your data must not silently
  replace values it set (its defaults are fine)."""
  from fedjax_dp.api import recipe_config
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  ds = fedjax_dp.data.from_arrays(x, y, client_ids=np.arange(40) % 4)
  four = {"num_clients": 4, "clients_per_round": 4}
  assert recipe_config(make_config(four), data=ds).dataset == "custom"
  with pytest.raises(ConfigError, match=r"^config key 'num_clients' = 10: your data has 4"):
    recipe_config(make_config({"num_clients": 10}), data=ds)
  with pytest.raises(ConfigError, match=r"^config key 'dataset' = 'fmnist' with your own"):
    recipe_config(make_config({**four, "dataset": "fmnist"}), data=ds)
