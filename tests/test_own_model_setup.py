"""setup with your own model, loss and data: one FedAvg round against a numpy
closed form, and the one-line refusals of what cannot work."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from fedjax_dp import losses
from fedjax_dp.cli import main
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.data import from_clients
from fedjax_dp.errors import DataError
from fedjax_dp.models import from_flax
from fedjax_dp.experiment.setup import setup

SIZES = (5, 9, 3, 7)


class Linear(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(x)


class Features(nn.Module):
  """A classifier with MOON's representation."""
  @nn.compact
  def __call__(self, x, with_features: bool = False):
    z = nn.relu(nn.Dense(6)(x))
    out = nn.Dense(3)(z)
    return (out, z) if with_features else out


def regression_clients(seed=0, d=3):
  rng = np.random.default_rng(seed)
  clients = []
  for n in SIZES:
    x = rng.normal(size=(n, d)).astype(np.float32)
    clients.append((x, (x @ np.arange(1, d + 1) + 0.25 + 0.1 * rng.normal(size=n))
                    .astype(np.float32)))
  test = (rng.normal(size=(6, d)).astype(np.float32), rng.normal(size=6).astype(np.float32))
  return clients, test


def own_config(**over):
  values = dict(dataset="custom", model="custom", num_clients=len(SIZES),
                clients_per_round=len(SIZES), batch_size=16, local_epochs=1, momentum=0.0,
                lr=0.1, rounds=1, devices=1)
  values.update(over)
  return make_config(values)


def test_one_fedavg_round_of_a_linear_model_is_the_size_weighted_gradient_step():
  """Full-batch local step (batch >= n_i, E = 1, no momentum) of the MSE, server SGD at
  lr 1: w' = w - lr sum_i n_i g_i / sum_i n_i, g_i = (2 / n_i) X_i^T (X_i w + b - y_i).
  The targets are fractions: truncating them to integers would change g_i."""
  clients, test = regression_clients()
  ds = from_clients(clients, test=test)
  model = from_flax(Linear(), clients[0][0][:1], name="linear")
  _, parts, sim = setup(own_config(), ds, model=model, task=losses.REGRESSION_MSE)
  state = sim.init_state()
  w = np.asarray(state.params["Dense_0"]["kernel"], np.float64)[:, 0]
  b = float(state.params["Dense_0"]["bias"][0])
  gw, gb = np.zeros(3), 0.0
  for x, y in clients:
    r = x @ w + b - y
    gw += len(y) * (2 / len(y)) * (x.T @ r)
    gb += len(y) * (2 / len(y)) * r.sum()
  n = sum(SIZES)
  state, stats = sim.run_rounds(state, 1)
  np.testing.assert_allclose(np.asarray(state.params["Dense_0"]["kernel"])[:, 0],
                             w - 0.1 * gw / n, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state.params["Dense_0"]["bias"], [b - 0.1 * gb / n], rtol=1e-5,
                             atol=1e-6)
  # the round's training loss is the MSE at w, weighted by client size
  want = sum(np.sum((x @ w + b - y) ** 2) for x, y in clients)
  np.testing.assert_allclose(float(np.sum(stats.loss_sum)), want, rtol=1e-5)
  metrics = sim.evaluate(state.params, *sim.test_data)
  assert sorted(metrics) == ["loss", "mae", "mse"]


def test_moon_needs_a_representation_and_solo_needs_classification():
  rng = np.random.default_rng(1)
  clients = [(rng.normal(size=(6, 4)).astype(np.float32), rng.integers(0, 3, 6))
             for _ in SIZES]
  ds = from_clients(clients, test=clients[0])
  plain = from_flax(nn.Dense(3), clients[0][0][:1], name="dense3")
  with pytest.raises(ConfigError, match="algorithm 'moon' with model 'dense3': MOON needs the "
                                        "model's representation") as e:
    setup(own_config(algorithm="moon"), ds, model=plain)
  assert "\n" not in str(e.value)
  moon = from_flax(Features(), clients[0][0][:1])
  _, _, sim = setup(own_config(algorithm="moon"), ds, model=moon)
  sim.run_rounds(sim.init_state(), 1)   # trains with the representation
  reg = from_clients([(x, y.astype(np.float32)) for x, y in clients], test=(
      clients[0][0], clients[0][1].astype(np.float32)))
  with pytest.raises(ConfigError, match="algorithm 'solo' with loss 'regression'"):
    setup(own_config(algorithm="solo"), reg, model=plain, task=losses.REGRESSION_MSE)


@pytest.mark.parametrize("over, model_fn, task, message", [
    (dict(), lambda x: from_flax(nn.Dense(2), x), losses.REGRESSION_MSE,
     r"model 'Dense' with loss 'regression' .*ValueError: regression outputs of shape \(2, 2\)"),
    (dict(), lambda x: from_flax(Linear(), x), losses.CLASSIFICATION,
     "targets are float32 but loss 'classification' takes int32 class labels"),
    (dict(num_clients=3, clients_per_round=3), lambda x: from_flax(Linear(), x),
     losses.REGRESSION_MSE, "config key 'num_clients' = 3: your data has 4 clients"),
    (dict(dataset="digits"), lambda x: from_flax(Linear(), x), losses.REGRESSION_MSE,
     "data of your own .* needs config key dataset 'custom'"),
    (dict(model="mlp"), lambda x: from_flax(Linear(), x), losses.REGRESSION_MSE,
     "a model of your own .* needs config key model 'custom'"),
    (dict(), lambda x: None, losses.REGRESSION_MSE,
     "config key 'model' = 'custom': your own model is passed to fedjax_dp.run"),
    (dict(), lambda x: from_flax(Linear(), x), losses.from_loss(lambda o, t, m: (o - t) ** 2),
     r"the loss returns shape \(2, 2\), expected a scalar"),
])
def test_setup_refuses_in_one_line(over, model_fn, task, message):
  clients, test = regression_clients()
  with pytest.raises((ConfigError, DataError), match=message) as e:
    setup(own_config(**over), from_clients(clients, test=test),
          model=model_fn(clients[0][0][:1]), task=task)
  assert "\n" not in str(e.value)


def test_a_classifier_with_too_few_outputs_is_refused():
  rng = np.random.default_rng(2)
  clients = [(rng.normal(size=(5, 4)).astype(np.float32), np.array([0, 1, 2, 3, 4]))
             for _ in SIZES]
  with pytest.raises(ConfigError, match=r"outputs of shape \(3,\) per example, expected \[5\] "
                                        r"logits \(labels go up to 4\)"):
    setup(own_config(), from_clients(clients, test=clients[0]),
          model=from_flax(nn.Dense(3), clients[0][0][:1]))


@pytest.mark.parametrize("key, message", [
    ("dataset=custom", "error: dataset 'custom' is your own data: it comes from fedjax_dp.run"),
    ("model=custom", "error: config key 'model' = 'custom': your own model is passed to"),
])
def test_the_cli_refuses_custom_names_in_one_line(tmp_path, capsys, key, message):
  assert main(["run", "--no-progress", "--out", str(tmp_path / "x"), "--set", key,
               "--set", "rounds=1"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(message) and err.count("\n") == 1
  assert not (tmp_path / "x").exists()
