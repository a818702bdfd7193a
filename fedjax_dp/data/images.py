"""The image datasets: where their files are and how they are read, with one-line errors.

MNIST and Fashion-MNIST from the four IDX files (plain or .gz), CIFAR-10 from
its python batches, scikit-learn's digits from the package. Images come back
as float32 [N, H, W, C] in [0, 1], labels as int32 [N] in 0..9.
Folders searched: data_dir, $FEDJAX_DP_DATA, ~/.cache, ~/data,
~/.keras/datasets (and the usual subfolders), then the Debian package
dataset-fashion-mnist.
"""

from __future__ import annotations

import gzip
import math
import os
import pickle
import zlib

import numpy as np

from fedjax_dp.data.dataset import Dataset, train_test_split
from fedjax_dp.errors import DataError

IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist"
_IDX_SUBDIRS = {"mnist": ("mnist", "MNIST", "MNIST/raw"),
                "fmnist": ("fmnist", "fashion-mnist", "fashion_mnist", "FashionMNIST",
                           "FashionMNIST/raw")}
_DATA_DIR = "data_dir (fedjax-dp run: --set data_dir=DIR; the experiment scripts: --data-dir DIR)"
# where to get each one (the first-hour review, finding 13: the error said where to put
# the files, not where they come from)
HOW_TO_GET = {
    "fmnist": ("install the Debian package dataset-fashion-mnist, or put the four IDX files "
               "(https://github.com/zalandoresearch/fashion-mnist, data/fashion) in a folder "
               f"and set {_DATA_DIR}"),
    "mnist": ("put the four MNIST IDX files (https://yann.lecun.com/exdb/mnist/, or the mirror "
              "https://ossci-datasets.s3.amazonaws.com/mnist/) in a folder and set "
              f"{_DATA_DIR}"),
    "cifar10": ("download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, unpack it "
                f"and set {_DATA_DIR}"),
}


def search_roots(data_dir: str | None) -> list[str]:
  """data_dir and $FEDJAX_DP_DATA, where given: the folders every loader searches first."""
  roots = [data_dir, os.environ.get("FEDJAX_DP_DATA")]
  return [os.path.expanduser(r) for r in roots if r]


def _idx_candidates(name: str, data_dir: str | None) -> list[str]:
  """Folders that may hold the IDX files, in search order."""
  home = os.path.expanduser("~")
  roots = search_roots(data_dir) + [os.path.join(home, ".cache"), os.path.join(home, "data"),
                              os.path.join(home, ".keras", "datasets")]
  dirs = []
  for root in roots:
    dirs.append(root)
    dirs += [os.path.join(root, sub) for sub in _IDX_SUBDIRS[name]]
  if name == "fmnist":
    dirs.append(DEBIAN_FMNIST)
  return dirs


def _idx_file(folder: str, stem: str) -> str | None:
  for candidate in (stem, stem + ".gz"):
    path = os.path.join(folder, candidate)
    if os.path.isfile(path):
      return path
  return None


def find_idx_folder(name: str, data_dir: str | None) -> tuple[str | None, list[str]]:
  """The first folder holding all four IDX files. A folder the user named
  (data_dir, $FEDJAX_DP_DATA, or their subfolders) holding only some of them is an
  error, not a reason to look further: the search would otherwise train on other
  data (e.g. the system's Fashion-MNIST) than the folder meant."""
  searched = _idx_candidates(name, data_dir)
  named = len(search_roots(data_dir)) * (1 + len(_IDX_SUBDIRS[name]))   # they come first
  for i, folder in enumerate(searched):
    found = [stem for stem in IDX_FILES.values() if _idx_file(folder, stem)]
    if len(found) == len(IDX_FILES):
      return folder, searched
    if found and i < named:
      missing = [stem for stem in IDX_FILES.values() if stem not in found]
      raise DataError(f"{folder}: holds {', '.join(found)} but not {', '.join(missing)} "
                      f"(or .gz): dataset {name!r} needs all four IDX files")
  return None, searched


def find_cifar_folder(data_dir: str | None) -> tuple[str | None, list[str]]:
  searched = []
  for root in search_roots(data_dir):
    for folder in (os.path.join(root, "cifar-10-batches-py"), root):
      searched.append(folder)
      if os.path.isfile(os.path.join(folder, "data_batch_1")):
        return folder, searched
  return None, searched


# ---------------------------------------------------------------------------- IDX


def _read_bytes(path: str) -> bytes:
  try:
    if path.endswith(".gz"):
      with gzip.open(path, "rb") as f:
        return f.read()
    with open(path, "rb") as f:
      return f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{path}: cannot read ({e.__class__.__name__}: {e}); expected a "
                    f"{'gzip-compressed ' if path.endswith('.gz') else ''}IDX file")


def read_idx(path: str, expect_magic: int) -> np.ndarray:
  """Reads one IDX file (big-endian header: magic, then one uint32 per dimension)."""
  raw = _read_bytes(path)
  kind = "images" if expect_magic == IMAGE_MAGIC else "labels"
  if len(raw) < 4:
    raise DataError(f"{path}: truncated: {len(raw)} bytes, expected an IDX header")
  magic = int.from_bytes(raw[:4], "big")
  if magic != expect_magic:
    raise DataError(f"{path}: bad IDX magic 0x{magic:08x}, expected 0x{expect_magic:08x} ({kind})")
  ndim = magic & 0xFF
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise DataError(f"{path}: truncated header: {len(raw)} bytes, expected {header}")
  dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  expected = header + math.prod(dims)
  if len(raw) != expected:
    raise DataError(f"{path}: {len(raw)} bytes, expected {expected} for {kind} of shape {dims} "
                    "(truncated or corrupt)")
  return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def load_idx_dataset(name: str, data_dir: str | None) -> Dataset:
  folder, searched = find_idx_folder(name, data_dir)
  if folder is None:
    raise DataError(f"dataset {name!r} not found (searched {', '.join(searched)}): "
                    f"{HOW_TO_GET[name]}")
  arrays = {}
  for key, stem in IDX_FILES.items():
    path = _idx_file(folder, stem)
    arrays[key] = read_idx(path, IMAGE_MAGIC if key.endswith("x") else LABEL_MAGIC)
  for split in ("train", "test"):
    xs, ys = arrays[f"{split}_x"], arrays[f"{split}_y"]
    x_path = _idx_file(folder, IDX_FILES[f"{split}_x"])
    y_path = _idx_file(folder, IDX_FILES[f"{split}_y"])
    if xs.ndim != 3:
      raise DataError(f"{x_path}: images of shape {xs.shape}, expected [N, rows, cols]")
    if ys.ndim != 1 or len(ys) != len(xs):
      raise DataError(f"{y_path}: {ys.shape[0]} labels, expected {len(xs)} (one per image in "
                      f"{x_path})")
    if ys.size and ys.max() > 9:
      raise DataError(f"{y_path}: label {int(ys.max())} out of range, expected 0..9")
  if arrays["train_x"].shape[1:] != arrays["test_x"].shape[1:]:
    raise DataError(f"{folder}: training images are {arrays['train_x'].shape[1:]} and test "
                    f"images {arrays['test_x'].shape[1:]}: both splits need one size")
  img = lambda a: (a.astype(np.float32) / 255.0)[..., None]
  return Dataset(name, img(arrays["train_x"]), arrays["train_y"].astype(np.int32),
                 img(arrays["test_x"]), arrays["test_y"].astype(np.int32), 10, folder)


# ---------------------------------------------------------------------------- CIFAR-10


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  if not os.path.isfile(path):
    raise DataError(f"{path}: missing, expected a CIFAR-10 python batch")
  try:
    with open(path, "rb") as f:
      batch = pickle.load(f, encoding="bytes")
    data, labels = batch[b"data"], batch[b"labels"]
  except Exception as e:
    raise DataError(f"{path}: not a CIFAR-10 python batch ({e.__class__.__name__}); expected a "
                    "pickled dict with b'data' and b'labels'")
  data = np.asarray(data)
  labels = np.asarray(labels)
  if data.dtype != np.uint8 or not np.issubdtype(labels.dtype, np.integer):
    raise DataError(f"{path}: data of dtype {data.dtype} and labels of dtype {labels.dtype}, "
                    "expected uint8 pixels and integer labels")
  if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
    raise DataError(f"{path}: data of shape {data.shape} with {len(labels)} labels, expected "
                    "[N, 3072] uint8 and N labels")
  if labels.size and (labels.min() < 0 or labels.max() > 9):
    raise DataError(f"{path}: labels out of range, expected 0..9")
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # stored channel-major
  return images, labels


def load_cifar10(data_dir: str | None) -> Dataset:
  folder, searched = find_cifar_folder(data_dir)
  if folder is None:
    where = ", ".join(searched) if searched else "no data_dir or $FEDJAX_DP_DATA given"
    raise DataError(f"dataset 'cifar10' not found (searched {where}): {HOW_TO_GET['cifar10']}")
  train = [_read_cifar_batch(os.path.join(folder, f"data_batch_{i}")) for i in range(1, 6)]
  test = _read_cifar_batch(os.path.join(folder, "test_batch"))
  img = lambda a: a.astype(np.float32) / 255.0
  return Dataset("cifar10", img(np.concatenate([t[0] for t in train])),
                 np.concatenate([t[1] for t in train]).astype(np.int32), img(test[0]),
                 test[1].astype(np.int32), 10, folder)


# ---------------------------------------------------------------------------- digits


def load_digits(seed: int) -> Dataset:
  from sklearn.datasets import load_digits
  d = load_digits()
  x = (d.images / 16.0).astype(np.float32)[..., None]  # 16 grey levels -> [0, 1]
  tr, te = train_test_split(len(d.target), 0.2, seed)
  return Dataset("digits", x[tr], d.target[tr].astype(np.int32), x[te],
                 d.target[te].astype(np.int32), 10, "scikit-learn load_digits")
