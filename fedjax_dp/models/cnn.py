"""The CNN of the FedAvg and LEAF papers: two 5x5 convolutions with max pooling,
then two dense layers."""

from __future__ import annotations

import flax.linen as nn

from fedjax_dp.models.conv import conv_general_dilated

# flax's convolution with gradients XLA:CPU runs fast inside loops (conv.py)
_Conv = lambda *a, **k: nn.Conv(*a, conv_general_dilated=conv_general_dilated, **k)


class CNN(nn.Module):
  """Conv(32, 5x5) -> pool -> Conv(64, 5x5) -> pool -> Dense(dense) -> Dense(classes).

  The CNN of McMahan et al. 2017 (dense 512) and of LEAF's FEMNIST baseline
  (Caldas et al. 2018, dense 2048: model 'leaf_cnn'), and of the TopkSDP-FL
  paper's CIFAR-10 runs; 'SAME' padding so that it also fits 8x8 digits, 28x28
  and 32x32 images.
  """
  num_classes: int
  dense: int = 512

  @nn.compact
  def __call__(self, x, with_features: bool = False):  # x: [batch, H, W, C]
    x = nn.max_pool(nn.relu(_Conv(32, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
    x = nn.max_pool(nn.relu(_Conv(64, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    logits = nn.Dense(self.num_classes)(x)
    return (logits, x) if with_features else logits
