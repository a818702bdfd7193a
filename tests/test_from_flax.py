"""models.from_flax: your flax module as a Model, the same numbers as the module itself."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.models import from_flax, make_model


class SmallCNN(nn.Module):
  """Conv -> pool -> Conv -> Dense -> Dense(classes), with MOON's representation."""
  classes: int = 5

  @nn.compact
  def __call__(self, x, with_features: bool = False):
    x = nn.max_pool(nn.relu(nn.Conv(4, (3, 3))(x)), (2, 2), (2, 2))
    x = nn.relu(nn.Conv(6, (3, 3), padding="VALID")(x))
    z = nn.relu(nn.Dense(12)(x.reshape((x.shape[0], -1))))
    out = nn.Dense(self.classes)(z)
    return (out, z) if with_features else out


class Plain(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


class WithBatchNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=True)(nn.Dense(3)(x))


def test_from_flax_matches_the_modules_own_init_and_apply():
  x = np.random.default_rng(0).random((6, 10, 10, 1)).astype(np.float32)
  module = SmallCNN()
  model = from_flax(module, x[:1], name="small_cnn")
  key = jax.random.PRNGKey(3)
  params = model.init(key)
  want = module.init(key, jnp.zeros((1, 10, 10, 1)))["params"]
  assert jax.tree.structure(params) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(model.apply(params, x), module.apply({"params": params}, x))
  out, z = model.apply_with_features(params, x)
  np.testing.assert_array_equal(out, module.apply({"params": params}, x))
  assert z.shape == (6, 12) and model.name == "small_cnn"


def test_a_module_without_with_features_has_none_and_a_default_name():
  model = from_flax(Plain(), np.zeros((1, 4), np.float32))
  assert model.apply_with_features is None and model.name == "Plain"
  params = model.init(jax.random.PRNGKey(0))
  assert model.apply(params, jnp.ones((3, 4))).shape == (3, 2)


@pytest.mark.parametrize("module, example, message", [
    (WithBatchNorm(), np.zeros((2, 4), np.float32),
     r"from_flax\(WithBatchNorm\): variable collections batch_stats besides 'params'"),
    (Plain(), np.float32(1.0), r"from_flax\(Plain\): example_input of shape \(\): expected a batch"),
    (SmallCNN(), np.zeros((1, 10), np.float32),
     r"from_flax\(SmallCNN\): module.init\(key, x\) failed on inputs of shape \(1, 10\)"),
])
def test_from_flax_refuses_what_it_cannot_train_in_one_line(module, example, message):
  with pytest.raises(ValueError, match=message) as e:
    from_flax(module, example)
  assert "\n" not in str(e.value)


def test_built_in_models_keep_their_representation():
  model = make_model("mlp", (8, 8, 1), 10, (16,))
  params = model.init(jax.random.PRNGKey(0))
  out, z = model.apply_with_features(params, jnp.ones((2, 8, 8, 1)))
  assert out.shape == (2, 10) and z.shape == (2, 16)
