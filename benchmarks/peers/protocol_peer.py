"""What every framework of benchmarks/peer_protocols.py shares: the two protocols,
the models as layer lists, the initial weights' layouts, the data file.

The protocols (pfl-research's image-classification benchmark settings,
benchmarks/image_classification/configs/{baseline,femnist}.yaml there: cohort 50,
local batch 10, one local epoch, client SGD lr 0.1 without momentum, central SGD
lr 1.0, no DP):

  cifar10   pfl's `cifar10_iid`: 50,000 images 32x32x3 (CIFAR-10's training set,
            standardised per channel as pfl does, or generated N(0, 1) images of
            its shape), shuffled and cut into 1,000 users of 50; model pfl's
            `simple_cnn` (fedjax_dp model 'simple_cnn', 1,626,442 parameters)
  femnist   3,400 writers of 28x28x1 images in [0, 1], 62 classes, sizes drawn
            from LEAF's FEMNIST size distribution (peer_protocols.py); model LEAF's
            FEMNIST CNN ('leaf_cnn', 6,603,710 parameters)

Every framework aggregates FedAvg's example-weighted mean (pfl: WeightByDatapoints;
pfl's configs weight by user, which on cifar10's equal users is the same) and draws
its own uniform cohorts (pfl with replacement, as its 'random' user sampler does).
The models have no dropout (pfl's and FedJAX's CNNs drop 0.25 and 0.5 in training):
fedjax_dp's models are deterministic, and the benchmark trains one model everywhere.

Stdlib and NumPy only: it runs in each peer's own venv.

  data .npz:    x [n, H, W, C] float32, y [n] int32, starts [N + 1] int64 (client i
                holds rows starts[i]:starts[i + 1]), check_x / check_y: the batch on
                which every framework reports its initial loss
  weights .npz: the initial weights, flax's names and layouts ("Conv_0/kernel"
                [kh, kw, in, out], "Dense_0/kernel" [in, out], ".../bias"); the
                dense layer after the flattening reads (h, w, c) order (NHWC)
"""

from __future__ import annotations

import argparse

import numpy as np

# name: (model, input shape, classes); the training settings are TRAIN's, for both
PROTOCOLS = {"cifar10": ("simple_cnn", (32, 32, 3), 10),
             "femnist": ("leaf_cnn", (28, 28, 1), 62)}
TRAIN = dict(cohort=50, batch=10, epochs=1, client_lr=0.1, server_lr=1.0)

# the models as layers: ("conv", name, out channels, kernel, padding), ("pool",): 2x2
# max pooling with stride 2, ("flatten",), ("dense", name, outputs or None for the
# classes), ("relu",)
LAYERS = {
    "simple_cnn": [("conv", "Conv_0", 32, 3, "VALID"), ("relu",),
                   ("conv", "Conv_1", 64, 3, "VALID"), ("relu",), ("pool",), ("flatten",),
                   ("dense", "Dense_0", 128), ("relu",), ("dense", "Dense_1", None)],
    "leaf_cnn": [("conv", "Conv_0", 32, 5, "SAME"), ("relu",), ("pool",),
                 ("conv", "Conv_1", 64, 5, "SAME"), ("relu",), ("pool",), ("flatten",),
                 ("dense", "Dense_0", 2048), ("relu",), ("dense", "Dense_1", None)],
}


def parse_args(description: str, argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--protocol", required=True, choices=sorted(PROTOCOLS))
  ap.add_argument("--data", required=True, help="the data .npz peer_protocols.py wrote")
  ap.add_argument("--weights", required=True, help="the initial weights .npz")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
  ap.add_argument("--cohort", type=int, default=TRAIN["cohort"],
                  help="clients a round (the protocols' 50; smaller only for checks)")
  args = ap.parse_args(argv)
  if args.rounds < 1 or args.cohort < 1:
    ap.error(f"--rounds {args.rounds} and --cohort {args.cohort}: both must be >= 1")
  return args


def load_data(path: str):
  """(x, y, starts, check_x, check_y) of a data .npz."""
  with np.load(path) as f:
    return f["x"], f["y"], f["starts"], f["check_x"], f["check_y"]


def load_weights(path: str) -> dict[str, np.ndarray]:
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def shapes(model: str, input_shape) -> list[tuple]:
  """Each layer of LAYERS[model] with the [H, W, C] (or [features]) it reads."""
  h, w, c = input_shape
  out, flat = [], None
  for layer in LAYERS[model]:
    out.append((layer, (h, w, c) if flat is None else (flat,)))
    if layer[0] == "conv":
      k = layer[3]
      if layer[4] == "VALID":
        h, w = h - k + 1, w - k + 1
      c = layer[2]
    elif layer[0] == "pool":
      h, w = h // 2, w // 2
    elif layer[0] == "flatten":
      flat = h * w * c
    elif layer[0] == "dense":
      flat = layer[2]
  return out


def train_flops(model: str, input_shape, classes: int) -> int:
  """FLOPs of one example's training step: 3x the forward pass's multiply-adds x 2
  (the backward pass's two products per layer), convolutions and dense layers only."""
  fwd = 0
  for layer, seen in shapes(model, input_shape):
    if layer[0] == "conv":
      _, _, out, k, padding = layer
      h, w, c = seen
      oh, ow = (h - k + 1, w - k + 1) if padding == "VALID" else (h, w)
      fwd += 2 * oh * ow * k * k * c * out
    elif layer[0] == "dense":
      fwd += 2 * seen[0] * (layer[2] or classes)
  return 3 * fwd


def to_torch(model: str, input_shape, weights: dict) -> dict[str, np.ndarray]:
  """The weights in PyTorch's layouts (a module of Conv2d / Linear layers on NCHW
  inputs that flattens in (c, h, w) order): {"Conv_0.weight" [out, in, kh, kw],
  "Dense_0.weight" [out, in], ... ".bias"}."""
  out, layers = {}, shapes(model, input_shape)
  for i, (layer, _) in enumerate(layers):
    if layer[0] not in ("conv", "dense"):
      continue
    name = layer[1]
    k = weights[f"{name}/kernel"]
    if layer[0] == "conv":
      k = k.transpose(3, 2, 0, 1)
    elif i and layers[i - 1][0][0] == "flatten":   # rows from (h, w, c) to (c, h, w) order
      h, w, c = layers[i - 1][1]
      k = k.reshape(h, w, c, -1).transpose(3, 2, 0, 1).reshape(k.shape[1], -1)
    else:
      k = k.T
    out[f"{name}.weight"] = np.ascontiguousarray(k)
    out[f"{name}.bias"] = weights[f"{name}/bias"]
  return out


def conv_nhwc(x: np.ndarray, w: np.ndarray, b: np.ndarray, padding: str) -> np.ndarray:
  """Stride-1 convolution, x [B, H, W, C], w [kh, kw, C, O] (XLA's SAME padding)."""
  kh, kw = w.shape[:2]
  if padding == "SAME":
    x = np.pad(x, ((0, 0), ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2), (0, 0)))
  win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))  # [B,H',W',C,kh,kw]
  return np.einsum("bhwcij,ijco->bhwo", win, w, optimize=True) + b


def forward(model: str, weights: dict, x: np.ndarray) -> np.ndarray:
  """The model's logits in NumPy (float64 accumulation), x [B, H, W, C]: the
  definition every framework's module is checked against."""
  x = x.astype(np.float64)
  for layer in LAYERS[model]:
    kind = layer[0]
    if kind == "conv":
      x = conv_nhwc(x, weights[f"{layer[1]}/kernel"], weights[f"{layer[1]}/bias"], layer[4])
    elif kind == "relu":
      x = np.maximum(x, 0)
    elif kind == "pool":
      b, h, w, c = x.shape
      x = x[:, :h // 2 * 2, :w // 2 * 2].reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
    elif kind == "flatten":
      x = x.reshape(len(x), -1)
    else:
      x = x @ weights[f"{layer[1]}/kernel"] + weights[f"{layer[1]}/bias"]
  return x


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
  """Mean softmax cross-entropy."""
  z = logits - logits.max(axis=1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  return float(-logp[np.arange(len(y)), y].mean())
