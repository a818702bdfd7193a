"""Model shapes and parameter counts against hand counts; the CNN trains inside a round."""

import jax
import numpy as np
import pytest

from fedjax_dp.models import make_model, num_params
from tests.helpers import toy_simulation


def test_mlp_parameter_count():
  model = make_model("mlp", (28, 28, 1), 10, (200, 200))
  params = model.init(jax.random.PRNGKey(0))
  assert num_params(params) == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
  assert model.apply(params, np.zeros((3, 28, 28, 1), np.float32)).shape == (3, 10)


@pytest.mark.parametrize("shape", [(8, 8, 1), (28, 28, 1), (32, 32, 3)])
def test_cnn_shapes_and_count(shape):
  model = make_model("cnn", shape, 10, (512,))
  params = model.init(jax.random.PRNGKey(0))
  h, w, c = shape
  flat = ((h + 1) // 2 + 1) // 2 * (((w + 1) // 2 + 1) // 2) * 64  # two 2x2 'SAME' poolings
  expected = (5 * 5 * c * 32 + 32) + (5 * 5 * 32 * 64 + 64) + (flat * 512 + 512) + (512 * 10 + 10)
  assert num_params(params) == expected
  assert model.apply(params, np.zeros((2,) + shape, np.float32)).shape == (2, 10)


def test_cnn_rejects_flat_inputs():
  with pytest.raises(ValueError, match="image inputs"):
    make_model("cnn", (30,), 2)


def test_cnn_round_runs_and_lowers_the_loss():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 2, 64).astype(np.int32)
  x = (rng.normal(size=(64, 8, 8, 1)) * 0.1 + y[:, None, None, None]).astype(np.float32)
  parts = np.array_split(np.arange(64), 4)
  sim = toy_simulation(x, y, parts, classes=2, model="cnn", hidden=[16], lr=0.05, local_epochs=1,
                       batch_size=8)
  assert sim.model.name == "cnn"
  state, stats = sim.run_rounds(sim.init_state(), 6)
  losses = np.asarray(stats.loss_sum) / np.asarray(stats.examples)
  assert losses[-1] < 0.5 * losses[0]
