"""benchmarks/peer_protocols.py at a tiny size: our side of both protocols, the
initial weights' export and their conversion to torch's layouts, and a peer whose
venv is absent skipped with the command that builds it."""

import os
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import peer_protocols as pp  # noqa: E402
import protocol_peer as proto  # noqa: E402

from fedjax_dp.models import make_model  # noqa: E402


@pytest.mark.parametrize("protocol", ["cifar10", "femnist"])
def test_our_side_runs_from_the_exported_weights(protocol, tmp_path, monkeypatch):
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)   # generated data, whatever is here
  data, weights = str(tmp_path / "data.npz"), str(tmp_path / "weights.npz")
  info = pp.write_data(protocol, data, clients=6, mean_size=8, data_dir=str(tmp_path))
  assert info["clients"] == 6 and "generated" in info["source"]
  assert pp.write_weights(protocol, weights) == {"cifar10": 1_626_442,
                                                 "femnist": 6_603_710}[protocol]
  reference = pp.reference_loss(protocol, data, weights)
  run = pp.run_ours(protocol, data, weights, 1, cohort=3)
  assert run["median_round_s"] > 0 and len(run["round_s"]) == 1
  # the initial loss is the NumPy forward pass's on the exported weights: the same model
  assert run["initial_loss"] == pytest.approx(reference, rel=1e-5)
  x, y, starts, *_ = proto.load_data(data)
  sizes = np.diff(starts)
  assert 0 < run["examples"][0] <= sizes.sum() and len(x) == len(y) == sizes.sum()
  if protocol == "cifar10":
    assert set(sizes) == {50}   # pfl's cifar10_iid: users of 50
  row = pp.compare(run, [], reference, 10**8, 50.0)[0]
  assert row["same_initial_loss"] and row["library"] == "fedjax-dp"
  assert row["gflops"] > 0
  assert row["fraction_of_peak"] == pytest.approx(row["gflops"] / 50, abs=1e-3)


def _conv_nchw(x, w, b, padding):
  """Stride-1 convolution in torch's layouts: x [B, C, H, W], w [O, C, kh, kw]."""
  kh, kw = w.shape[2:]
  if padding == "SAME":
    x = np.pad(x, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
  win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
  return np.einsum("bchwij,ocij->bohw", win, w) + b[:, None, None]


def _torch_layout_forward(model, tw, x):
  """The model as a torch user's module computes it: NHWC batches transposed to NCHW,
  (c, h, w) flattening, Linear's [out, in] weights."""
  x = x.astype(np.float64).transpose(0, 3, 1, 2)
  for layer in proto.LAYERS[model]:
    kind = layer[0]
    if kind == "conv":
      x = _conv_nchw(x, tw[f"{layer[1]}.weight"], tw[f"{layer[1]}.bias"], layer[4])
    elif kind == "relu":
      x = np.maximum(x, 0)
    elif kind == "pool":
      b, c, h, w = x.shape
      x = x.reshape(b, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    elif kind == "flatten":
      x = x.reshape(len(x), -1)
    else:
      x = x @ tw[f"{layer[1]}.weight"].T + tw[f"{layer[1]}.bias"]
  return x


@pytest.mark.parametrize("protocol", ["cifar10", "femnist"])
def test_exported_weights_give_our_logits_in_numpy_and_in_torchs_layouts(protocol, tmp_path):
  name, shape, classes = proto.PROTOCOLS[protocol]
  path = str(tmp_path / "w.npz")
  pp.write_weights(protocol, path)
  weights = proto.load_weights(path)
  model = make_model(name, shape, classes)
  params = {layer: {k: weights[f"{layer}/{k}"] for k in leaves}
            for layer, leaves in model.init(jax.random.PRNGKey(0)).items()}
  x = np.random.default_rng(1).standard_normal((2,) + shape).astype(np.float32)
  ours = np.asarray(model.apply(params, x))
  np.testing.assert_allclose(proto.forward(name, weights, x), ours, rtol=1e-4, atol=1e-4)
  tw = proto.to_torch(name, shape, weights)
  assert tw["Conv_0.weight"].shape == (32, shape[2]) + (proto.LAYERS[name][0][3],) * 2
  np.testing.assert_allclose(_torch_layout_forward(name, tw, x), ours, rtol=1e-4, atol=1e-4)


def test_a_peer_without_its_venv_is_skipped_with_the_command_that_builds_it(
    tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(pp, "PEERS_DIR", str(tmp_path))
  for name, script in (("pfl", "setup_pfl.sh"), ("fedjax", "setup_fedjax.sh")):
    skip = pp.skipped_peer(name)
    assert skip["library"] == name and f"sh benchmarks/peers/{script}" in skip["skipped"]
  ours = {"library": "fedjax-dp", "median_round_s": 1.0, "round_s": [1.0], "examples": [10],
          "initial_loss": 2.0}
  rows = pp.compare(ours, [pp.skipped_peer("pfl")], 2.0)
  assert "setup_pfl.sh" in rows[1]["not_run"] and "ratio_round" not in rows[1]
  # named on the command line, it is refused before anything runs
  with pytest.raises(SystemExit) as e:
    pp.main(["--protocols", "cifar10", "--peers", "pfl"])
  assert e.value.code == 2 and "setup_pfl.sh" in capsys.readouterr().err


def test_the_real_files_are_read_where_data_dir_holds_them(tmp_path, monkeypatch):
  """CIFAR-10's python batches (standardised per channel, as pfl does) and LEAF's
  FEMNIST writers, instead of generated arrays."""
  import pickle
  from fedjax_dp.data.sample_files import write_leaf_femnist
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)
  folder = tmp_path / "cifar-10-batches-py"
  folder.mkdir()
  rng = np.random.default_rng(0)
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    with open(folder / name, "wb") as f:
      pickle.dump({b"data": rng.integers(0, 256, (100, 3072), dtype=np.uint8),
                   b"labels": list(rng.integers(0, 10, 100))}, f)
  info = pp.write_data("cifar10", str(tmp_path / "c.npz"), clients=10, data_dir=str(tmp_path))
  assert info["source"].startswith("CIFAR-10") and info["clients"] == 10
  x, *_ = proto.load_data(str(tmp_path / "c.npz"))
  assert x.shape == (500, 32, 32, 3) and abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1
  write_leaf_femnist(str(tmp_path / "femnist"), 12, 15, seed=0)
  info = pp.write_data("femnist", str(tmp_path / "f.npz"), clients=8,
                       data_dir=str(tmp_path / "femnist"))
  assert info["source"].startswith("LEAF FEMNIST") and info["clients"] == 8
  x, y, starts, *_ = proto.load_data(str(tmp_path / "f.npz"))
  assert x.shape[1:] == (28, 28, 1) and len(x) == starts[-1] and y.max() < 62
