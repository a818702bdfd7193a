"""pfl-research's CIFAR-10 benchmark CNN (its `simple_cnn`): two 3x3 convolutions
without padding, one 2x2 max pooling, a dense layer of 128, the classes.

The Keras MNIST example's CNN, which pfl-research's image-classification
benchmarks train on CIFAR-10 and FEMNIST (benchmarks/model/*/cnn.py there) and
FedJAX's EMNIST model (fedjax.models.emnist.create_conv_model) also is. Theirs
have dropout (0.25 after the pooling, 0.5 after the dense layer); this one has
none, as every built-in model here is deterministic (models/model.py).
"""

from __future__ import annotations

import flax.linen as nn

from fedjax_dp.models.conv import conv_general_dilated

# flax's convolution with gradients XLA:CPU runs fast inside loops (conv.py)
_Conv = lambda *a, **k: nn.Conv(*a, conv_general_dilated=conv_general_dilated, **k)


class SimpleCNN(nn.Module):
  """Conv(32, 3x3, VALID) -> Conv(64, 3x3, VALID) -> pool 2x2 -> Dense(128) -> Dense(classes).

  ReLU after each convolution and the dense layer; on 32x32x3 inputs with 10
  classes, 1,626,442 parameters (12,544 features into the dense layer).
  """
  num_classes: int
  dense: int = 128

  @nn.compact
  def __call__(self, x, with_features: bool = False):  # x: [batch, H, W, C]
    x = nn.relu(_Conv(32, (3, 3), padding="VALID")(x))
    x = nn.relu(_Conv(64, (3, 3), padding="VALID")(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    logits = nn.Dense(self.num_classes)(x)
    return (logits, x) if with_features else logits
