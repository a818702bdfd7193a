"""A run's own inputs (inputs.json) tell apart what a resume or a reuse must not mix:
models of the same shapes, losses of the same name, other data under the same config."""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import api, data, losses, models

from fedjax_dp.experiment import runner


class Net(nn.Module):
  act: str = "relu"

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(4)(x)
    return nn.Dense(3)(nn.relu(h) if self.act == "relu" else jnp.tanh(h))


def test_models_and_losses_of_equal_names_and_shapes_differ():
  x = np.zeros((1, 6), np.float32)
  relu, tanh = models.from_flax(Net("relu"), x), models.from_flax(Net("tanh"), x)
  ce = losses.CLASSIFICATION
  assert runner.own_inputs(relu, None, ce) != runner.own_inputs(tanh, None, ce)
  assert runner.own_inputs(relu, None, ce) == runner.own_inputs(
      models.from_flax(Net("relu"), x), None, ce)
  sq = losses.get(lambda o, t, m: jnp.sum(jnp.square(o[:, 0] - t) * m) / jnp.maximum(m.sum(), 1))
  ab = losses.get(lambda o, t, m: jnp.sum(jnp.abs(o[:, 0] - t) * m) / jnp.maximum(m.sum(), 1))
  assert runner.own_inputs(relu, None, sq) != runner.own_inputs(relu, None, ab)


def test_reuse_refuses_a_finished_run_made_with_other_data(tmp_path):
  rng = np.random.default_rng(0)

  def dataset(scale):
    x = rng.normal(size=(80, 4)).astype(np.float32) * scale
    return data.from_arrays(x, (x[:, 0] > 0).astype(int), partition="iid", num_clients=4,
                            seed=0)
  a, b = dataset(1.0), dataset(100.0)
  out = str(tmp_path / "run")
  keys = dict(rounds=1, hidden=[4], eval_every=1)
  first = runner.run_or_reuse(api.recipe_config("fedavg", data=a, **keys), out, data=a,
                              progress=False, log=lambda m: None)
  again = runner.run_or_reuse(api.recipe_config("fedavg", data=a, **keys), out, data=a,
                              progress=False, log=lambda m: None)
  assert again["final"] == first["final"]                  # same inputs: reused
  with pytest.raises(runner.RunError, match="other inputs") as e:
    runner.run_or_reuse(api.recipe_config("fedavg", data=b, **keys), out, data=b,
                        progress=False, log=lambda m: None)
  assert "\n" not in str(e.value)
