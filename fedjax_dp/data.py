"""Dataset loaders: numpy arrays plus metadata, from standard files, with one-line errors.

Images come back as float32 [N, H, W, C] in [0, 1]; tabular data as float32
[N, d], scaled by `scale_features` as `feature_scaling` says: 'pooled' (the
default of `load_dataset`: the training set's mean and deviation) or 'none'
(raw). 'per_client' needs the partition, so `runner.setup` applies it after
partitioning. Labels are int32 [N] in 0..num_classes-1.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import math
import os
import pickle
import zlib

import numpy as np


class DataError(ValueError):
  """A missing, truncated or corrupt data file, or a bad data option; one line."""


@dataclasses.dataclass(frozen=True)
class Dataset:
  name: str
  x_train: np.ndarray  # float32 [N, ...]
  y_train: np.ndarray  # int32 [N]
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  source: str          # the folder or file it was read from, or how it was made
  # tabular data: column names, known sensitivity tiers (indices into
  # tabular.TIERS; None when unknown) and which columns are sensitive attributes
  feature_names: tuple[str, ...] = ()
  feature_tiers: np.ndarray | None = None
  sensitive: np.ndarray | None = None
  # how x_train and x_test were standardised (FEATURE_SCALINGS); images: 'none'
  feature_scaling: str = "none"

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_train.shape[1:])


DATASETS = ("digits", "mnist", "fmnist", "cifar10", "csv", "synthetic", "healthcare",
            "breast_cancer")
# the datasets whose features are standardised (images are scaled to [0, 1] by a fixed rule)
TABULAR = ("csv", "synthetic", "healthcare", "breast_cancer")
FEATURE_SCALINGS = ("pooled", "per_client", "none")

IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist"
_IDX_SUBDIRS = {"mnist": ("mnist", "MNIST", "MNIST/raw"),
                "fmnist": ("fmnist", "fashion-mnist", "fashion_mnist", "FashionMNIST",
                           "FashionMNIST/raw")}
_DATA_DIR = "data_dir (fedjax-dp run: --set data_dir=DIR; the experiment scripts: --data-dir DIR)"
_HOW_TO_GET = {
    "fmnist": f"install the Debian package dataset-fashion-mnist or set {_DATA_DIR}",
    "mnist": f"put the four MNIST IDX files in a folder and set {_DATA_DIR}",
    "cifar10": f"unpack cifar-10-python.tar.gz and set {_DATA_DIR}",
}


def _roots(data_dir: str | None) -> list[str]:
  roots = [data_dir, os.environ.get("FEDJAX_DP_DATA")]
  return [os.path.expanduser(r) for r in roots if r]


def _idx_candidates(name: str, data_dir: str | None) -> list[str]:
  """Folders that may hold the IDX files, in search order."""
  home = os.path.expanduser("~")
  roots = _roots(data_dir) + [os.path.join(home, ".cache"), os.path.join(home, "data"),
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


def _find_idx_folder(name: str, data_dir: str | None) -> tuple[str | None, list[str]]:
  """The first folder holding all four IDX files. A folder the user named
  (data_dir, $FEDJAX_DP_DATA, or their subfolders) holding only some of them is an
  error, not a reason to look further: the search would otherwise train on other
  data (e.g. the system's Fashion-MNIST) than the folder meant."""
  searched = _idx_candidates(name, data_dir)
  named = len(_roots(data_dir)) * (1 + len(_IDX_SUBDIRS[name]))   # they come first
  for i, folder in enumerate(searched):
    found = [stem for stem in IDX_FILES.values() if _idx_file(folder, stem)]
    if len(found) == len(IDX_FILES):
      return folder, searched
    if found and i < named:
      missing = [stem for stem in IDX_FILES.values() if stem not in found]
      raise DataError(f"{folder}: holds {', '.join(found)} but not {', '.join(missing)} "
                      f"(or .gz): dataset {name!r} needs all four IDX files")
  return None, searched


def _find_cifar_folder(data_dir: str | None) -> tuple[str | None, list[str]]:
  searched = []
  for root in _roots(data_dir):
    for folder in (os.path.join(root, "cifar-10-batches-py"), root):
      searched.append(folder)
      if os.path.isfile(os.path.join(folder, "data_batch_1")):
        return folder, searched
  return None, searched


def find_dataset(name: str, data_dir: str | None = None) -> tuple[bool, str]:
  """(available here?, where it is or why not). Never raises for missing data."""
  if name == "digits":
    return True, "scikit-learn (shipped)"
  if name == "synthetic":
    return True, "generated on demand (any size)"
  if name == "healthcare":
    return True, "generated on demand: 847 features in 4 groups with known tiers"
  if name == "breast_cancer":
    return True, "scikit-learn (shipped)"
  if name == "csv":
    return True, "any CSV file: --set dataset=csv --set csv_path=FILE"
  if name in ("mnist", "fmnist"):
    folder, _ = _find_idx_folder(name, data_dir)
    return (True, folder) if folder else (False, _HOW_TO_GET[name])
  if name == "cifar10":
    folder, _ = _find_cifar_folder(data_dir)
    return (True, folder) if folder else (False, _HOW_TO_GET[name])
  raise DataError(f"unknown dataset {name!r} (allowed: {', '.join(DATASETS)})")


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


def _load_idx_dataset(name: str, data_dir: str | None) -> Dataset:
  folder, searched = _find_idx_folder(name, data_dir)
  if folder is None:
    raise DataError(f"dataset {name!r} not found (searched {', '.join(searched)}): "
                    f"{_HOW_TO_GET[name]}")
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


def _load_cifar10(data_dir: str | None) -> Dataset:
  folder, searched = _find_cifar_folder(data_dir)
  if folder is None:
    where = ", ".join(searched) if searched else "no data_dir or $FEDJAX_DP_DATA given"
    raise DataError(f"dataset 'cifar10' not found (searched {where}): {_HOW_TO_GET['cifar10']}")
  train = [_read_cifar_batch(os.path.join(folder, f"data_batch_{i}")) for i in range(1, 6)]
  test = _read_cifar_batch(os.path.join(folder, "test_batch"))
  img = lambda a: a.astype(np.float32) / 255.0
  return Dataset("cifar10", img(np.concatenate([t[0] for t in train])),
                 np.concatenate([t[1] for t in train]).astype(np.int32), img(test[0]),
                 test[1].astype(np.int32), 10, folder)


# ---------------------------------------------------------------------------- tabular


def _split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  perm = np.random.default_rng(seed).permutation(n)
  n_test = max(1, int(round(n * test_fraction)))
  return perm[n_test:], perm[:n_test]


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-column mean and deviation of x's rows; a constant column's deviation is 1."""
  mean, std = x.mean(0), x.std(0)
  return mean, np.where(std > 0, std, 1.0)


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  mean, std = _moments(train)
  return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def scale_features(x_train: np.ndarray, x_test: np.ndarray, parts: list[np.ndarray] | None,
                   mode: str) -> tuple[np.ndarray, np.ndarray]:
  """Standardises tabular features [N, d]; returns float32 (x_train, x_test).

  With mu(S), sigma(S) the per-column mean and deviation of the rows S (sigma = 1
  for a constant column):

    pooled      x_i <- (x_i - mu(T)) / sigma(T) for every training and test row,
                T = all training rows. Every client's rows enter mu(T) and sigma(T),
                so one client's data moves every client's inputs.
    per_client  x_i <- (x_i - mu(P_k)) / sigma(P_k) for i in P_k = parts[k], client k's
                rows: a client's inputs depend on its own data only. The test set is
                standardised with its own statistics, x_j <- (x_j - mu(E)) / sigma(E)
                over the test rows E, like one more client doing the same: it reads no
                training client's data, and needs no public statistics (which csv data
                does not have). Computed in float64 from x as given.
    none        x as given (raw), as float32.

  parts: disjoint index arrays into x_train (needed for per_client only); a row in
  no part is never trained on and stays raw.
  """
  if mode == "pooled":
    return _standardize(x_train, x_test)
  if mode == "none":
    return x_train.astype(np.float32), x_test.astype(np.float32)
  if mode != "per_client":
    raise DataError(f"feature_scaling {mode!r}: allowed values are "
                    f"{', '.join(FEATURE_SCALINGS)}")
  if parts is None:
    raise DataError("feature_scaling 'per_client' needs the partition (parts): each client "
                    "standardises its own rows")
  rows = np.concatenate([np.asarray(p, np.int64) for p in parts]) if parts else np.zeros(0, int)
  if len(np.unique(rows)) != len(rows):
    raise DataError("feature_scaling 'per_client': a training row is in more than one client's "
                    "part; the parts must be disjoint")
  out = x_train.astype(np.float32)
  for p in parts:
    if len(p):
      x = x_train[p].astype(np.float64)
      mean, std = _moments(x)
      out[p] = ((x - mean) / std).astype(np.float32)
  test = x_test.astype(np.float64)
  mean, std = _moments(test)
  return out, ((test - mean) / std).astype(np.float32)


def apply_feature_scaling(ds: Dataset, parts: list[np.ndarray], mode: str) -> Dataset:
  """ds with its features scaled by `mode`, after partitioning into `parts`.

  `load_dataset` applies 'pooled' and 'none' itself (pooled from the loader's raw
  precision); 'per_client' is applied here to data loaded with 'none'. Data
  loaded with another scaling than `mode` is an error: it cannot be undone."""
  if ds.feature_scaling == mode:
    return ds
  if mode == "per_client" and ds.feature_scaling == "none":
    x_train, x_test = scale_features(ds.x_train, ds.x_test, parts, mode)
    return dataclasses.replace(ds, x_train=x_train, x_test=x_test, feature_scaling=mode)
  load_as = "none" if mode == "per_client" else mode
  raise DataError(f"dataset {ds.name!r} was loaded with feature_scaling {ds.feature_scaling!r} "
                  f"but the config resolves it to {mode!r}: load it with runner.load_data(cfg) "
                  f"or load_dataset(..., feature_scaling={load_as!r})")


def _load_digits(seed: int) -> Dataset:
  from sklearn.datasets import load_digits
  d = load_digits()
  x = (d.images / 16.0).astype(np.float32)[..., None]  # 16 grey levels -> [0, 1]
  tr, te = _split(len(d.target), 0.2, seed)
  return Dataset("digits", x[tr], d.target[tr].astype(np.int32), x[te],
                 d.target[te].astype(np.int32), 10, "scikit-learn load_digits")


def _load_csv(path: str | None, label_column: str = "label", test_fraction: float = 0.2,
              seed: int = 0, tier_map: str | None = None) -> Dataset:
  if not path:
    raise DataError("dataset 'csv' needs csv_path")
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such CSV file")
  try:
    # utf-8-sig: spreadsheet exports start with a byte-order mark
    with open(path, newline="", encoding="utf-8-sig") as f:
      rows = list(csv.reader(f))
  except UnicodeDecodeError:
    raise DataError(f"{path}: not UTF-8 text, expected a CSV file")
  except csv.Error as e:
    raise DataError(f"{path}: not a CSV file this reader takes ({e})")
  if not rows:
    raise DataError(f"{path}: empty file, expected a header row and data rows")
  header = [h.strip() for h in rows[0]]
  if label_column not in header:
    raise DataError(f"{path}: no column {label_column!r} (columns: {', '.join(header)})")
  li = header.index(label_column)
  feats = [i for i in range(len(header)) if i != li]
  if not feats:
    raise DataError(f"{path}: no feature columns besides {label_column!r}")
  x = np.empty((len(rows) - 1, len(feats)), np.float64)
  labels = []
  for r, row in enumerate(rows[1:]):
    line = r + 2
    if len(row) != len(header):
      raise DataError(f"{path}: line {line} has {len(row)} fields, expected {len(header)}")
    for j, i in enumerate(feats):
      try:
        x[r, j] = float(row[i])
      except ValueError:
        raise DataError(f"{path}: line {line}, column {header[i]!r}: {row[i]!r} is not a number")
      if not np.isfinite(x[r, j]):   # nan / inf parse as floats, then poison training
        raise DataError(f"{path}: line {line}, column {header[i]!r}: {row[i]!r} is not a finite "
                        "number")
    labels.append(row[li].strip())
  if len(labels) < 2:
    raise DataError(f"{path}: {len(labels)} data rows, expected at least 2")
  # Labels may be integers or names: map their sorted distinct values to 0..K-1
  # ("1" and "1.0" are one class; 1.7 is not a class label).
  if "" in labels:
    raise DataError(f"{path}: line {labels.index('') + 2}: empty {label_column!r}")
  try:
    numbers = [float(v) for v in labels]
  except ValueError:
    numbers = None
  if numbers is not None:
    bad = [v for v, f in zip(labels, numbers) if not (np.isfinite(f) and f == int(f))]
    if bad:
      raise DataError(f"{path}: label {bad[0]!r} in column {label_column!r} is not a class "
                      "(expected integers or names; a continuous target is regression)")
    labels = [str(int(f)) for f in numbers]
    classes = sorted(set(labels), key=int)
  else:
    classes = sorted(set(labels))
  if len(classes) < 2:
    raise DataError(f"{path}: column {label_column!r} holds one class ({classes[0]!r}): "
                    "classification needs at least 2")
  lookup = {c: k for k, c in enumerate(classes)}
  y = np.array([lookup[v] for v in labels], np.int32)
  tr, te = _split(len(y), test_fraction, seed)
  names = tuple(header[i] for i in feats)
  tiers = None
  if tier_map:
    from fedjax_dp.tabular import TierMapError, read_tier_map
    try:
      tiers = read_tier_map(tier_map, list(names))
    except TierMapError as e:
      raise DataError(str(e))
  return Dataset("csv", x[tr], y[tr], x[te], y[te], max(len(classes), 2), path,
                 feature_names=names, feature_tiers=tiers)


def _load_healthcare(num_examples: int = 5000, seed: int = 0) -> Dataset:
  from fedjax_dp.tabular import healthcare_data
  if num_examples < 10:
    raise DataError(f"healthcare: num_examples={num_examples}; expected >= 10")
  x, y, tiers, names, sensitive = healthcare_data(num_examples, seed)
  tr, te = _split(len(y), 0.2, seed)
  return Dataset("healthcare", x[tr], y[tr], x[te], y[te], 3, f"generated (seed {seed})",
                 feature_names=tuple(names), feature_tiers=tiers, sensitive=sensitive)


def _load_breast_cancer(seed: int = 0) -> Dataset:
  from fedjax_dp.tabular import breast_cancer_data
  x, y, names = breast_cancer_data()
  tr, te = _split(len(y), 0.2, seed)
  return Dataset("breast_cancer", x[tr], y[tr], x[te], y[te], 2, "scikit-learn load_breast_cancer",
                 feature_names=tuple(names))


def _load_synthetic(num_examples: int = 10000, num_features: int = 32, num_classes: int = 10,
                    seed: int = 0) -> Dataset:
  """Gaussian class clusters with unit noise and class means of norm ~2, so
  neighbouring classes overlap: a linear model reaches about 60-65 % on 10
  classes, well above chance but not perfect. The test set is 20 % extra draws."""
  if num_examples < 2 or num_features < 1 or num_classes < 2:
    raise DataError(f"synthetic: num_examples={num_examples}, num_features={num_features}, "
                    f"num_classes={num_classes}; expected >= 2, >= 1, >= 2")
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(num_classes, num_features)) * 2.0 / math.sqrt(num_features)
  n_test = max(1, num_examples // 5)
  y = rng.integers(0, num_classes, size=num_examples + n_test).astype(np.int32)
  x = (means[y] + rng.normal(size=(len(y), num_features))).astype(np.float32)
  return Dataset("synthetic", x[:num_examples], y[:num_examples], x[num_examples:],
                 y[num_examples:], num_classes,
                 f"generated (seed {seed})")


def _load_raw(name: str, data_dir: str | None, seed: int, options: dict) -> Dataset:
  """The dataset as read: tabular features raw, in the loader's precision."""
  if name == "digits":
    return _load_digits(seed)
  if name in ("mnist", "fmnist"):
    return _load_idx_dataset(name, data_dir)
  if name == "cifar10":
    return _load_cifar10(data_dir)
  if name == "csv":
    return _load_csv(seed=seed, **options)
  if name == "synthetic":
    return _load_synthetic(seed=seed, **options)
  if name == "healthcare":
    return _load_healthcare(seed=seed, **options)
  if name == "breast_cancer":
    return _load_breast_cancer(seed)
  raise DataError(f"unknown dataset {name!r} (allowed: {', '.join(DATASETS)})")


def load_dataset(name: str, data_dir: str | None = None, *, seed: int = 0,
                 feature_scaling: str | None = None, **options) -> Dataset:
  """Loads a dataset by name; options: csv (path, label_column, test_fraction, tier_map),
  synthetic (num_examples, num_features, num_classes), healthcare (num_examples).

  feature_scaling (tabular datasets): 'pooled' (None: the default) or 'none', applied
  by `scale_features`; 'per_client' needs the partition: load with 'none', then
  `apply_feature_scaling` (runner.setup does both). Images take None or 'none'."""
  if name in DATASETS and name not in TABULAR and feature_scaling not in (None, "none"):
    raise DataError(f"feature_scaling {feature_scaling!r} with dataset {name!r}: images are "
                    f"scaled to [0, 1] by a fixed rule; only {', '.join(TABULAR)} are "
                    "standardised")
  if name in TABULAR and feature_scaling not in (None, "pooled", "none"):
    raise DataError(f"feature_scaling {feature_scaling!r}: load_dataset takes 'pooled' or "
                    "'none' ('per_client' needs the partition: load with 'none', then "
                    "apply_feature_scaling)")
  if data_dir is not None and not os.path.isdir(os.path.expanduser(data_dir)):
    # an explicit folder that is not there is a typo, not a reason to look elsewhere
    raise DataError(f"data_dir {data_dir!r} is not a folder")
  ds = _load_raw(name, data_dir, seed, options)
  if name not in TABULAR:
    return ds
  mode = feature_scaling or "pooled"
  x_train, x_test = scale_features(ds.x_train, ds.x_test, None, mode)
  return dataclasses.replace(ds, x_train=x_train, x_test=x_test, feature_scaling=mode)
