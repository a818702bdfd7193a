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


# ---------------------------------------------------------------- the benchmarks' models


def test_leaf_cnn_is_leafs_femnist_cnn():
  """LEAF's FEMNIST CNN (Caldas et al. 2018): 5x5 convs of 32 and 64 channels, each
  max-pooled 2x2, a dense layer of 2048, 62 outputs: its parameters by hand."""
  model = make_model("leaf_cnn", (28, 28, 1), 62)
  expected = (5 * 5 * 1 * 32 + 32) + (5 * 5 * 32 * 64 + 64) + (7 * 7 * 64 * 2048 + 2048) \
      + (2048 * 62 + 62)
  assert num_params(model.init(jax.random.PRNGKey(0))) == expected == 6_603_710


@pytest.mark.parametrize("classes, expected", [(10, 11_173_962), (100, 11_220_132)])
def test_resnet18_has_the_cifar_resnet18s_parameters(classes, expected):
  """The CIFAR ResNet-18 (3x3 stem, no bias before a norm): 11,173,962 parameters with
  10 classes as the torchvision-style network counts them; GroupNorm's scale and
  bias are batch norm's affine parameters, one each per channel."""
  model = make_model("resnet18", (32, 32, 3), classes)
  params = model.init(jax.random.PRNGKey(0))
  assert num_params(params) == expected
  gn = [k for k in jax.tree_util.tree_flatten_with_path(params)[0] if "GroupNorm" in str(k[0])]
  assert gn and not any("BatchNorm" in str(k[0]) for k in
                        jax.tree_util.tree_flatten_with_path(params)[0])


def test_resnet18_keeps_no_batch_statistics():
  """Each example's outputs are its own (group norm over its own channels): the
  batch's other examples change nothing, so clients' rows never mix."""
  model = make_model("resnet18", (16, 16, 3), 5)
  params = model.init(jax.random.PRNGKey(1))
  x = np.random.default_rng(0).random((4, 16, 16, 3), np.float32)
  both = model.apply(params, x)
  for i in range(4):
    np.testing.assert_allclose(model.apply(params, x[i:i + 1])[0], both[i], rtol=1e-4,
                               atol=1e-5)
  logits, features = model.apply_with_features(params, x)
  assert features.shape == (4, 512)


def test_models_that_ignore_hidden_refuse_it():
  from fedjax_dp.errors import ConfigError
  from fedjax_dp import make_config
  with pytest.raises(ConfigError, match="'hidden'"):
    make_config({"model": "leaf_cnn", "hidden": [64]})


@pytest.mark.parametrize("name", ["leaf_cnn",
                                  pytest.param("resnet18", marks=pytest.mark.slow)])   # 90 s
def test_benchmark_models_through_the_round(name):
  """The round's paths agree on these models (map: a loop over clients; vmap:
  batched; 2 devices) and central DP's clipped, noised round runs on them."""
  rng = np.random.default_rng(0)
  y = rng.integers(0, 3, 24).astype(np.int32)
  x = (rng.random((24, 8, 8, 1 if name == "leaf_cnn" else 3)) * 0.2
       + y[:, None, None, None] * 0.3).astype(np.float32)
  assert_paths_agree_and_dp_runs(x, y, 3, model=name, lr=0.05)


def assert_paths_agree_and_dp_runs(x, y, classes, **values):
  """Two rounds on the map path, the vmap path and 2 devices to float summation
  order, and one round of central DP's clipped, noised round, on 4 clients
  (`task`, a losses.Task, among values: the loss and targets; default classification)."""
  parts = np.array_split(np.arange(len(y)), 4)
  common = dict(values, hidden=[200, 200], local_epochs=1, batch_size=6, momentum=0.0)
  runs = {}
  for path, devices in (("map", 1), ("vmap", 1), ("vmap", 2)):
    sim = toy_simulation(x, y, parts, classes=classes, devices=devices, client_parallelism=path,
                         **common)
    state, _ = sim.run_rounds(sim.init_state(), 2)
    runs[path, devices] = jax.tree.leaves(jax.device_get(state.params))
  for other in (("vmap", 1), ("vmap", 2)):
    for a, b in zip(runs["map", 1], runs[other]):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
  dp = toy_simulation(x, y, parts, classes=classes, dp="central", noise_multiplier=0.5,
                      clip_norm=1.0, **common)
  state, stats = dp.run_rounds(dp.init_state(), 1)
  assert np.isfinite(np.asarray(stats.loss_sum)).all()


def test_hiddens_read_condition_names_the_models_that_read_it():
  from fedjax_dp.models import MODELS
  from fedjax_dp.recipes.config_checks import _SETUP_KEYS_READ
  assert _SETUP_KEYS_READ["hidden"][1] == "model " + ", ".join(
      repr(m) for m, s in MODELS.items() if s.reads_hidden)


def test_char_lstm_parameters_by_hand():
  """Embedding 8, two LSTM layers of 256 (4 gates: input kernel, recurrent kernel and
  one bias each), a dense output: LEAF's Shakespeare model with 81 symbols."""
  model = make_model("char_lstm", (80,), 81)
  lstm = lambda n_in: 4 * (n_in * 256 + 256 * 256 + 256)
  expected = 81 * 8 + lstm(8) + lstm(256) + (256 * 81 + 81)
  assert num_params(model.init(jax.random.PRNGKey(0))) == expected == 818_137
  with pytest.raises(ValueError, match="token ids"):
    make_model("char_lstm", (8, 8, 1), 10)


@pytest.mark.slow   # 30 s
def test_char_lstm_through_the_round():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 5, (24, 12)).astype(np.float32)
  y = (x[:, -1].astype(np.int32) + 1) % 5
  assert_paths_agree_and_dp_runs(x, y, 5, model="char_lstm", lr=0.5)


def test_a_model_that_does_not_take_the_datas_inputs_is_a_config_error():
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  from fedjax_dp.experiment.setup import builtin_model, load_data
  cfg = make_config({"dataset": "breast_cancer", "model": "resnet18"})
  with pytest.raises(ConfigError, match="'model' = 'resnet18' with dataset 'breast_cancer': "
                                        "model 'resnet18' needs image inputs"):
    builtin_model(cfg, load_data(cfg))
