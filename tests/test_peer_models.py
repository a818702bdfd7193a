"""The peers' benchmark models against their parameter counts by hand."""

import jax
import numpy as np
import pytest

from fedjax_dp.models import make_model, num_params


@pytest.mark.parametrize("shape, classes, expected", [((32, 32, 3), 10, 1_626_442),
                                                      ((28, 28, 1), 62, 1_206_590)])
def test_simple_cnn_is_pfl_researchs_cifar10_cnn(shape, classes, expected):
  """pfl-research's simple_cnn: 3x3 convs of 32 and 64 channels without padding,
  one 2x2 max pooling, dense 128, the classes. On CIFAR-10 32 -> 30 -> 28 -> 14, so
  14 * 14 * 64 = 12,544 features into the dense layer; on 28x28x1 with 62 classes
  it is FedJAX's EMNIST CNN (1,206,590 parameters)."""
  h, w, c = shape
  flat = (h - 4) // 2 * ((w - 4) // 2) * 64
  by_hand = (3 * 3 * c * 32 + 32) + (3 * 3 * 32 * 64 + 64) + (flat * 128 + 128) \
      + (128 * classes + classes)
  model = make_model("simple_cnn", shape, classes)
  params = model.init(jax.random.PRNGKey(0))
  assert num_params(params) == by_hand == expected
  assert model.apply(params, np.zeros((2,) + shape, np.float32)).shape == (2, classes)
