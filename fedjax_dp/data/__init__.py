"""Dataset loaders: numpy arrays plus metadata, from standard files, with one-line errors.

Images come back as float32 [N, H, W, C] in [0, 1]; tabular data as float32
[N, d], scaled by `scale_features` as `feature_scaling` says: 'pooled' (the
default of `load_dataset`: the training set's mean and deviation) or 'none'
(raw). 'per_client' needs the partition, so `runner.setup` applies it after
partitioning. Labels are int32 [N] in 0..num_classes-1.

Your own data: `from_arrays(x, y, ...)` and `from_clients([(x_i, y_i), ...])`
check it and return a Dataset that carries its own client partition
(`client_parts`); integer targets stay int32 class labels, real targets
float32 (regression), from here to the store and the evaluation.
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
  y_train: np.ndarray  # int32 [N] class labels, or float32 [N] / [N, k] real targets
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int     # 0 for real (regression) targets
  source: str          # the folder or file it was read from, or how it was made
  # tabular data: column names, known sensitivity tiers (indices into
  # tabular.TIERS; None when unknown) and which columns are sensitive attributes
  feature_names: tuple[str, ...] = ()
  feature_tiers: np.ndarray | None = None
  sensitive: np.ndarray | None = None
  # how x_train and x_test were standardised (FEATURE_SCALINGS); images: 'none'
  feature_scaling: str = "none"
  # the data's own split over clients (from_arrays, from_clients): one index array
  # into x_train per client; None: the config's `partition` splits the data
  client_parts: tuple[np.ndarray, ...] | None = None

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_train.shape[1:])

  @property
  def output_size(self) -> int:
    """Outputs a built-in model needs: the classes, or the target's width (1 for [N])."""
    return self.num_classes or int(np.prod(self.y_train.shape[1:], dtype=np.int64))


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
    from fedjax_dp.data.tabular import TierMapError, read_tier_map
    try:
      tiers = read_tier_map(tier_map, list(names))
    except TierMapError as e:
      raise DataError(str(e))
  return Dataset("csv", x[tr], y[tr], x[te], y[te], max(len(classes), 2), path,
                 feature_names=names, feature_tiers=tiers)


def _load_healthcare(num_examples: int = 5000, seed: int = 0) -> Dataset:
  from fedjax_dp.data.tabular import healthcare_data
  if num_examples < 10:
    raise DataError(f"healthcare: num_examples={num_examples}; expected >= 10")
  x, y, tiers, names, sensitive = healthcare_data(num_examples, seed)
  tr, te = _split(len(y), 0.2, seed)
  return Dataset("healthcare", x[tr], y[tr], x[te], y[te], 3, f"generated (seed {seed})",
                 feature_names=tuple(names), feature_tiers=tiers, sensitive=sensitive)


def _load_breast_cancer(seed: int = 0) -> Dataset:
  from fedjax_dp.data.tabular import breast_cancer_data
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


# ---------------------------------------------------------------------------- your own data

_LABEL_PARTITIONS = ("dirichlet", "shards", "dirichlet_client")
_PARTITION_OPTIONS = ("alpha", "classes_per_client", "quantity_alpha")


def _features(x, what: str = "x") -> np.ndarray:
  """x [N, ...] as float32, checked: numbers, at least 2-D, every value finite."""
  x = np.asarray(x)
  if x.dtype.kind not in "biuf":
    raise DataError(f"{what} has dtype {x.dtype}: expected numbers (int or float features)")
  if x.ndim < 2:
    raise DataError(f"{what} has shape {x.shape}: expected [N, features...] (one row per "
                    "example; reshape a single feature with x[:, None])")
  x32 = x.astype(np.float32)
  bad = ~np.isfinite(x32)
  if bad.any():
    row = int(np.argwhere(bad)[0][0])
    value = x.reshape(len(x), -1)[row][bad.reshape(len(x), -1)[row]][0]
    raise DataError(f"{what} row {row} holds {value} (as float32): features must be finite "
                    "numbers; drop or impute those rows")
  return x32


def _targets(y, n: int, what: str = "y") -> np.ndarray:
  """y as int32 [N] class labels or float32 [N] / [N, k] real targets, checked against n rows."""
  y = np.asarray(y)
  if y.dtype.kind not in "biuf":
    raise DataError(f"{what} has dtype {y.dtype}: expected integer class labels or real "
                    "(float) targets")
  if y.ndim == 0 or len(y) != n:
    raise DataError(f"{what} has {len(y) if y.ndim else 0} rows but x has {n}: one target "
                    "per example")
  if y.dtype.kind == "f":
    if y.ndim > 2:
      raise DataError(f"{what} has shape {y.shape}: expected [N] or [N, k] targets")
    y32 = y.astype(np.float32)
    if not np.isfinite(y32).all():
      row = int(np.argwhere(~np.isfinite(y32))[0][0])
      raise DataError(f"{what} row {row} is not a finite number (as float32): targets must be "
                      "finite")
    return y32
  if y.ndim != 1:
    raise DataError(f"{what} has shape {y.shape}: integer class labels are one per row, [N]")
  if n and (y.min() < 0 or y.max() > np.iinfo(np.int32).max):
    bad = y.min() if y.min() < 0 else y.max()
    raise DataError(f"{what} holds class label {bad}: labels must be 0..K-1")
  return y.astype(np.int32)


def _check_parts(parts, n: int) -> list[np.ndarray]:
  """A user's index lists: integers in 0..n-1, every row in exactly one, none empty."""
  out, seen = [], np.zeros(n, np.int64)
  for i, p in enumerate(parts):
    p = np.asarray(p)
    if p.ndim != 1 or (p.size and p.dtype.kind not in "iu"):
      raise DataError(f"partition[{i}]: expected a 1-D array of integer row indices, got "
                      f"dtype {p.dtype} shape {p.shape}")
    if p.size == 0:
      raise DataError(f"partition[{i}] is empty: every client needs at least one row")
    if p.min() < 0 or p.max() >= n:
      raise DataError(f"partition[{i}] holds row {int(p.min() if p.min() < 0 else p.max())}: "
                      f"indices must be in 0..{n - 1}")
    np.add.at(seen, p, 1)
    out.append(np.sort(p).astype(np.int64))
  if not out:
    raise DataError("partition is an empty list: expected one index array per client")
  if (seen != 1).any():
    row = int(np.flatnonzero(seen != 1)[0])
    raise DataError(f"row {row} is in {int(seen[row])} clients' parts: every row must be in "
                    "exactly one (drop unused rows from x and y first)")
  return out


def _client_rows(client_ids, n: int) -> list[np.ndarray]:
  """Index arrays per distinct client id (sorted ids: client k is the k-th)."""
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or len(ids) != n:
    raise DataError(f"client_ids has shape {ids.shape} but x has {n} rows: one client id per "
                    "row")
  if ids.dtype.kind == "f" and not np.all(ids == np.round(ids)):
    raise DataError("client_ids holds non-integer numbers: expected integer or string ids")
  if not n:
    return []
  _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
  order = np.argsort(inverse.reshape(-1), kind="stable")   # rows grouped by client, in order
  return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


def _holdout(parts: list[np.ndarray], fraction: float, seed: int):
  """(train parts, test rows): floor(fraction n_i) random rows of each client held out
  (each keeps at least one row)."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for p in parts:
    p = rng.permutation(p)
    k = int(math.floor(fraction * len(p)))
    test.append(p[:k])
    train.append(np.sort(p[k:]))
  test = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
  if not len(test):
    raise DataError(f"test_fraction {fraction:g} holds out no row (every client has fewer "
                    f"than {math.ceil(1 / fraction)} rows): pass test=(x_test, y_test)")
  return train, test


def _test_arrays(test, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """test=(x_test, y_test), checked against the training arrays' shapes and kind."""
  if not (isinstance(test, (tuple, list)) and len(test) == 2):
    raise DataError("test: expected a pair (x_test, y_test)")
  xt = _features(test[0], "test x")
  yt = _targets(test[1], len(xt), "test y")
  if xt.shape[1:] != x.shape[1:]:
    raise DataError(f"test x has rows of shape {xt.shape[1:]} but x has {x.shape[1:]}: both "
                    "need one shape")
  if yt.dtype != y.dtype or yt.shape[1:] != y.shape[1:]:
    raise DataError(f"test y is {yt.dtype} {yt.shape[1:]} per row but y is {y.dtype} "
                    f"{y.shape[1:]}: both need one kind of target")
  if not len(xt):
    raise DataError("test has no rows: evaluation needs at least one")
  return xt, yt


def _own_dataset(name: str, source: str, x, y, parts, test_rows, test) -> Dataset:
  """The Dataset of rows not in test_rows (or all rows, with test arrays given),
  with `parts` re-indexed into x_train."""
  rows = np.sort(np.concatenate(parts))
  if test is not None:
    xt, yt = _test_arrays(test, x, y)
  else:
    xt, yt = x[test_rows], y[test_rows]
  reindex = [np.searchsorted(rows, p).astype(np.int64) for p in parts]
  labels = y.dtype.kind == "i"
  num_classes = int(max(y.max(), yt.max())) + 1 if labels and len(y) else 0
  return Dataset(name, x[rows], y[rows], xt, yt, num_classes, source,
                 client_parts=tuple(reindex))


def from_arrays(x, y, *, client_ids=None, partition=None, num_clients: int | None = None,
                test=None, test_fraction: float | None = None, seed: int = 0,
                name: str = "arrays", **partition_options) -> Dataset:
  """Your arrays as a Dataset that carries its client partition (for fedjax_dp.run).

  x [N, ...]: finite numeric features (kept as float32). y [N]: integer class labels
  (int32) or real targets (float32, [N] or [N, k]); never cast from one to the other.
  Clients, one of:
    client_ids [N]   the client of each row (ints or strings; client k = k-th sorted id)
    partition        a list of index arrays into x, one per client, each row in exactly
                     one; or a name with num_clients: 'iid', 'quantity' (any targets),
                     'dirichlet', 'shards', 'dirichlet_client' (class labels), options
                     alpha, classes_per_client, quantity_alpha as for the config keys
  Test set, one of:
    test=(x_test, y_test)
    test_fraction=f  (default 0.2) a partition name: a random f of all rows, before
                     partitioning; client_ids or index lists: floor(f n_i) random rows
                     of each client (each keeps at least one)
  seed drives every random choice here. DataError (one line) names a bad value.
  """
  x = _features(x)
  y = _targets(y, len(x))
  if (client_ids is None) == (partition is None):
    raise DataError("from_arrays: give exactly one of client_ids (a client per row) or "
                    "partition (index lists, or a name with num_clients)")
  if test is not None and test_fraction is not None:
    raise DataError("from_arrays: give test=(x_test, y_test) or test_fraction, not both")
  f = 0.2 if test_fraction is None else test_fraction
  if not 0 < f < 1:
    raise DataError(f"test_fraction {f!r}: must be in (0, 1)")
  if isinstance(partition, str):
    return _partitioned(name, x, y, partition, num_clients, test, f, seed, partition_options)
  if partition_options or num_clients is not None:
    given = ", ".join(sorted(partition_options) + (["num_clients"] if num_clients else []))
    raise DataError(f"from_arrays: {given} go with a partition name; client_ids and index "
                    "lists fix the clients themselves")
  parts = _client_rows(client_ids, len(x)) if client_ids is not None else _check_parts(
      partition, len(x))
  if not parts:
    raise DataError("from_arrays: x has no rows")
  test_rows = None
  if test is None:
    parts, test_rows = _holdout(parts, f, seed)
  return _own_dataset(name, "from_arrays", x, y, parts, test_rows, test)


def _partitioned(name, x, y, method, num_clients, test, fraction, seed, options) -> Dataset:
  """from_arrays with a partition name: hold out the test rows, then split the rest."""
  from fedjax_dp.data.partition import PARTITIONS, partition
  if method not in PARTITIONS:
    raise DataError(f"partition {method!r}: allowed are {', '.join(PARTITIONS)}, or a list of "
                    "index arrays")
  bad = sorted(set(options) - set(_PARTITION_OPTIONS))
  if bad:
    raise DataError(f"from_arrays: unknown option {bad[0]!r} (allowed: "
                    f"{', '.join(_PARTITION_OPTIONS)})")
  if method in _LABEL_PARTITIONS and y.dtype.kind != "i":
    raise DataError(f"partition {method!r} splits by class label but y holds real targets "
                    f"({y.dtype}): use 'iid', 'quantity', client_ids or index lists")
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise DataError(f"partition {method!r} needs num_clients >= 1 (got {num_clients!r})")
  if test is None:
    train, test_rows = _split(len(x), fraction, seed)
  else:
    train, test_rows = np.arange(len(x)), None
  labels = y[train] if y.dtype.kind == "i" else np.zeros(len(train), np.int32)
  parts = [train[p] for p in partition(labels, int(num_clients), method, seed=seed, **options)]
  return _own_dataset(name, f"from_arrays (partition {method})", x, y, parts, test_rows, test)


def from_clients(clients, *, test=None, test_fraction: float | None = None, seed: int = 0,
                 name: str = "clients") -> Dataset:
  """[(x_i, y_i), ...], one pair per client, as a Dataset (see from_arrays: the same
  checks, and test=(x_test, y_test) or test_fraction of each client's rows)."""
  clients = list(clients)
  if not clients:
    raise DataError("from_clients: no clients: expected a list of (x_i, y_i) pairs")
  xs, ys = [], []
  for i, pair in enumerate(clients):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
      raise DataError(f"from_clients: client {i}: expected a pair (x_i, y_i)")
    xi = _features(pair[0], f"client {i} x")
    yi = _targets(pair[1], len(xi), f"client {i} y")
    if not len(xi):
      raise DataError(f"from_clients: client {i} has no rows: every client needs at least one")
    if xs and (xi.shape[1:] != xs[0].shape[1:] or yi.dtype != ys[0].dtype
               or yi.shape[1:] != ys[0].shape[1:]):
      raise DataError(f"from_clients: client {i} has x rows {xi.shape[1:]} and y {yi.dtype} "
                      f"{yi.shape[1:]}, client 0 {xs[0].shape[1:]} and {ys[0].dtype} "
                      f"{ys[0].shape[1:]}: every client needs the same shapes")
    xs.append(xi)
    ys.append(yi)
  ids = np.repeat(np.arange(len(xs)), [len(v) for v in xs])
  ds = from_arrays(np.concatenate(xs), np.concatenate(ys), client_ids=ids, test=test,
                   test_fraction=test_fraction, seed=seed, name=name)
  return dataclasses.replace(ds, source=f"from_clients ({len(xs)} clients)")


def check_targets(ds: Dataset, target_dtype: str | None, loss_name: str) -> None:
  """DataError (one line) when ds's targets are not the kind the loss takes."""
  if target_dtype is None:
    return
  kind = np.asarray(ds.y_train).dtype
  if target_dtype == "int32" and kind.kind not in "iu":
    raise DataError(f"targets are {kind} but loss {loss_name!r} takes int32 class labels: "
                    "pass integer labels (y.astype(int)) or a regression loss (loss='mse')")
  if target_dtype == "float32" and kind.kind != "f":
    raise DataError(f"targets are {kind} class labels but loss {loss_name!r} takes float32 "
                    "real targets: pass y.astype(np.float32) or loss='classification'")
