"""TensorFlow Federated's HDF5 files, read with h5py (no TensorFlow): federated
EMNIST (62 classes, or its digits-only version) and CIFAR-100.

TFF's `simulation.datasets` download tarballs of HDF5 files
(https://storage.googleapis.com/tff-datasets-public/<name>.tar.bz2, cached in
~/.keras/datasets) laid out as HDF5ClientData reads them: a group `examples`
with one group per client id (in id order), each holding one dataset per
feature, its first axis the client's examples:

  fed_emnist[_digitsonly]_{train,test}.h5  pixels float32 [n, 28, 28] in [0, 1],
      the paper 1.0 and the ink near 0; label int32 [n] (0-9 digits, 10-35 A-Z,
      36-61 a-z). The test file holds held-out examples of the same 3,400 (3,383
      digits-only) writers.
  fed_cifar100_{train,test}.h5  image uint8 [n, 32, 32, 3]; label int64 [n]
      (100 fine classes), coarse_label int64 [n] (20 superclasses); 500 training
      and 100 other test clients of 100 examples each.

EMNIST comes back with ink 1 on 0 (1 - pixels, as FedJAX's preprocessing and
MNIST have it) as float32 [N, 28, 28, 1]; CIFAR-100 as float32 [N, 32, 32, 3] in
[0, 1] (pixels / 255).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.images import search_roots
from fedjax_dp.data.natural import ClientArrays, from_client_arrays
from fedjax_dp.errors import DataError

_TFF = "https://storage.googleapis.com/tff-datasets-public/"
FILES = {   # dataset -> (stem of its files, the tarball holding them)
    "emnist": ("fed_emnist", "fed_emnist.tar.bz2"),
    "emnist_digits": ("fed_emnist_digitsonly", "fed_emnist_digitsonly.tar.bz2"),
    "cifar100": ("fed_cifar100", "fed_cifar100.tar.bz2"),
    "cifar100_coarse": ("fed_cifar100", "fed_cifar100.tar.bz2"),
    # text (tff_text.py)
    "shakespeare_tff": ("shakespeare", "shakespeare.tar.bz2"),
    "stackoverflow": ("stackoverflow", "stackoverflow.tar.bz2"),
}


def how_to_get(name: str) -> str:
  stem, tarball = FILES[name]
  also = (f" and {_TFF}stackoverflow.word_count.tar.bz2 (the vocabulary) into the same folder"
          if name == "stackoverflow" else "")
  return (f"download {_TFF}{tarball}{also}, unpack {'them' if also else 'it'} (tar xjf) and set "
          "data_dir to the folder "
          f"holding {stem}_train.h5 and {stem}_test.h5 (TensorFlow Federated's cache, "
          "~/.keras/datasets, is searched too)")


def find_h5_folder(name: str, data_dir: str | None) -> tuple[str | None, list[str]]:
  """The first folder holding <stem>_train.h5 and <stem>_test.h5."""
  stem = FILES[name][0]
  searched = []
  for root in search_roots(data_dir) + [os.path.expanduser("~/.keras/datasets")]:
    for folder in (root, os.path.join(root, stem)):
      searched.append(folder)
      if all(os.path.isfile(os.path.join(folder, f"{stem}_{s}.h5")) for s in ("train", "test")):
        return folder, searched
  return None, searched


def _open(path: str):
  import h5py
  try:
    f = h5py.File(path, "r")
  except OSError as e:
    raise DataError(f"{path}: cannot read as HDF5 ({e})") from None
  if "examples" not in f:
    held = ", ".join(f.keys()) or "nothing"
    f.close()
    raise DataError(f"{path}: no group 'examples' (holds {held}): not a TensorFlow Federated "
                    "client-data file")
  return f


def read_client_ids(path: str) -> list[str]:
  """A TFF HDF5 file's client ids, in id order (without reading their examples)."""
  with _open(path) as f:
    return sorted(f["examples"])


def read_clients(path: str, features: tuple[str, ...], only: set[str] | None = None
                 ) -> list[tuple[str, dict]]:
  """[(client id, {feature: array [n, ...]})] of a TFF HDF5 file, in id order;
  `only`: just those clients (the others' examples are not read)."""
  with _open(path) as f:
    out = []
    for cid in sorted(f["examples"]):   # h5py lists names in order; sorted says so
      if only is not None and cid not in only:
        continue
      group = f["examples"][cid]
      missing = [k for k in features if k not in group]
      if missing:
        raise DataError(f"{path}: client {cid!r} lacks {', '.join(missing)} (holds "
                        f"{', '.join(group.keys())})")
      arrays = {k: group[k][()] for k in features}
      sizes = {len(a) for a in arrays.values()}
      if len(sizes) != 1:
        raise DataError(f"{path}: client {cid!r} has features of lengths {sorted(sizes)}")
      out.append((cid, arrays))
  return out


def _emnist_client(classes: int) -> Callable[[str, str, dict], ClientArrays]:
  def client(path: str, cid: str, a: dict) -> ClientArrays:
    pixels, label = np.asarray(a["pixels"], np.float32), np.asarray(a["label"])
    if label.ndim != 1:
      raise DataError(f"{path}: client {cid!r} has labels of shape {label.shape}, expected [n]")
    if pixels.shape[1:] != (28, 28):
      raise DataError(f"{path}: client {cid!r} has pixels of shape {pixels.shape}, expected "
                      "[n, 28, 28]")
    if label.size and (label.min() < 0 or label.max() >= classes):
      raise DataError(f"{path}: client {cid!r} has labels outside 0..{classes - 1}")
    return cid, (1.0 - pixels)[..., None], label.astype(np.int32)
  return client


def _cifar100_client(label_key: str) -> Callable[[str, str, dict], ClientArrays]:
  classes = 100 if label_key == "label" else 20

  def client(path: str, cid: str, a: dict) -> ClientArrays:
    image, label = np.asarray(a["image"]), np.asarray(a[label_key])
    if label.ndim != 1:
      raise DataError(f"{path}: client {cid!r} has {label_key} of shape {label.shape}, "
                      "expected [n]")
    if image.dtype != np.uint8 or image.shape[1:] != (32, 32, 3):
      raise DataError(f"{path}: client {cid!r} has images {image.dtype} {image.shape}, expected "
                      "uint8 [n, 32, 32, 3]")
    if label.size and (label.min() < 0 or label.max() >= classes):
      raise DataError(f"{path}: client {cid!r} has {label_key} outside 0..{classes - 1}")
    return cid, image.astype(np.float32) / 255.0, label.astype(np.int32)
  return client


_READERS = {   # dataset -> (features read, one client's arrays, classes)
    "emnist": (("pixels", "label"), _emnist_client(62), 62),
    "emnist_digits": (("pixels", "label"), _emnist_client(10), 10),
    "cifar100": (("image", "label"), _cifar100_client("label"), 100),
    "cifar100_coarse": (("image", "coarse_label"), _cifar100_client("coarse_label"), 20),
}


def load_tff(name: str, data_dir: str | None) -> Dataset:
  """A TFF dataset's clients (FILES) with its training and test files."""
  folder, searched = find_h5_folder(name, data_dir)
  if folder is None:
    raise DataError(f"dataset {name!r} not found (searched {', '.join(searched)}): "
                    f"{how_to_get(name)}")
  features, client, classes = _READERS[name]
  splits = {}
  for split in ("train", "test"):
    path = os.path.join(folder, f"{FILES[name][0]}_{split}.h5")
    splits[split] = [client(path, cid, a) for cid, a in read_clients(path, features)]
  return from_client_arrays(name, splits["train"], splits["test"], classes, folder,
                            same_clients=same_test_clients(name))


def same_test_clients(name: str) -> bool:
  """Whether TFF's test file for `name` holds the training clients' own held-out
  examples (EMNIST's writers), not other people (CIFAR-100's test clients)."""
  return name.startswith("emnist")
