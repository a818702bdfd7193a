"""ResNet-18 with group normalisation, for 32x32 images (CIFAR).

He et al. 2016's 18-layer network in its CIFAR form (a 3x3 stem of 64 channels,
no max pooling; four stages of two basic blocks, 64-128-256-512 channels, the
last three starting with stride 2; global average pooling; one dense layer),
with every batch normalisation replaced by group normalisation with 2 groups, as
federated benchmarks run it (Hsieh et al. 2020; Reddi et al. 2021's CIFAR runs):
batch statistics are per client and would leak across clients, and GroupNorm
keeps all its variables in 'params', which the round trains and averages.
11.2 M parameters with 100 classes.

Each block's last normalisation starts with scale 0 (Goyal et al. 2017, *Accurate,
Large Minibatch SGD*; torchvision's zero_init_residual), so every block starts as
the identity (plus its shortcut): from scratch, without it, SGD with momentum 0.9
left the network at chance at learning rates 0.01 and above; with it 0.05 trains
(tests/test_model_accuracy.py).
"""

from __future__ import annotations

import flax.linen as nn

from fedjax_dp.models.conv import conv_general_dilated

GROUPS = 2

# flax's convolution with gradients XLA:CPU runs fast inside loops (conv.py)
_Conv = lambda *a, **k: nn.Conv(*a, conv_general_dilated=conv_general_dilated, **k)


def _norm(scale_init=nn.initializers.ones):
  return nn.GroupNorm(num_groups=GROUPS, scale_init=scale_init)


class BasicBlock(nn.Module):
  """conv3x3 -> GN -> ReLU -> conv3x3 -> GN (scale 0 at initialisation), plus the
  input (a 1x1 strided convolution and GN where the shape changes), -> ReLU."""
  channels: int
  stride: int = 1

  @nn.compact
  def __call__(self, x):   # [B, H, W, C] -> [B, H / stride, W / stride, channels]
    y = nn.relu(_norm()(_Conv(self.channels, (3, 3), self.stride, padding=1,
                                use_bias=False)(x)))
    y = _norm(nn.initializers.zeros)(_Conv(self.channels, (3, 3), padding=1,
                                          use_bias=False)(y))
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = _norm()(_Conv(self.channels, (1, 1), self.stride, use_bias=False)(x))
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """[B, H, W, C] images -> logits [B, classes] (and the pooled [B, 512]
  representation, MOON's, if with_features)."""
  num_classes: int
  stages: tuple[int, ...] = (64, 128, 256, 512)
  blocks: int = 2

  @nn.compact
  def __call__(self, x, with_features: bool = False):
    x = nn.relu(_norm()(_Conv(self.stages[0], (3, 3), padding=1, use_bias=False)(x)))
    for i, channels in enumerate(self.stages):
      for j in range(self.blocks):
        x = BasicBlock(channels, stride=2 if i > 0 and j == 0 else 1)(x)
    features = x.mean(axis=(1, 2))
    logits = nn.Dense(self.num_classes)(features)
    return (logits, features) if with_features else logits
