"""The datasets by name: DATASETS (DatasetSource each), TABULAR, `register_dataset`,
`find_dataset` and `load_dataset`.

`load_dataset` reads a dataset (images.py, csv_file.py, tabular.py) and, for
tabular data, scales its features as `feature_scaling` says (scaling.py):
'pooled' (the default) or 'none'.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, NamedTuple

from fedjax_dp.data.csv_file import load_csv
from fedjax_dp import losses
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.errors import DataError
from fedjax_dp.data.images import (HOW_TO_GET, find_cifar_folder, find_idx_folder,
                                   load_cifar10, load_digits, load_idx_dataset)
from fedjax_dp.data.scaling import scale_features
from fedjax_dp.data.tabular import load_breast_cancer, load_healthcare, load_synthetic
from fedjax_dp.data import leaf, tff_h5, tff_text

class DatasetSource(NamedTuple):
  """A dataset by name (the config's `dataset`): how to find and load it.

  load(data_dir, seed, **options) -> Dataset: its training and test rows, tabular
    features raw (load_dataset scales them); `options` are a built-in's own keys
    (csv_path, synthetic_examples, ...), none for a registered one.
  find(data_dir) -> (available here?, where it is or how to get it); never raises.
  tabular: its features are standardised (feature_scaling); images are scaled to
    [0, 1] by the loader.
  class_names: the classes' names where it has them (plots).
  natural_clients: the loader returns its clients (Dataset.client_ids, client_parts):
    partition 'natural_id' trains them (natural.py).
  task: the loss and metrics its targets go with when the caller names none
    (losses.next_token for token sequences); None: classification.
  reads_chosen: its load takes clients=(num_clients, test_clients, seed) and reads
    only the clients partition natural_id takes (files too large to read whole).
  writers_test_split: its test split holds held-out rows of its training clients
    (LEAF's and TFF's writers, roles and users; not CIFAR-100's other people)."""
  name: str
  load: Callable[..., Dataset]
  find: Callable[[str | None], tuple[bool, str]] = lambda data_dir: (True, "registered")
  tabular: bool = False
  class_names: tuple[str, ...] = ()
  natural_clients: bool = False   # its examples come with their clients (natural.py)
  task: losses.Task | None = None
  reads_chosen: bool = False
  writers_test_split: bool = False


def _found(where: str) -> Callable[[str | None], tuple[bool, str]]:
  return lambda data_dir: (True, where)


def _find_idx(name: str):
  def find(data_dir):
    folder, _ = find_idx_folder(name, data_dir)
    return (True, folder) if folder else (False, HOW_TO_GET[name])
  return find


def _find_leaf(name: str):
  def find(data_dir):
    folder, _ = leaf.find_leaf_folder(name, data_dir)
    return (True, folder) if folder else (False, leaf.HOW_TO_GET[name])
  return find


def _find_tff(name: str):
  def find(data_dir):
    folder, _ = tff_h5.find_h5_folder(name, data_dir)
    if folder and name == "stackoverflow" and not os.path.isfile(
        os.path.join(folder, tff_text.WORD_COUNTS)):   # the vocabulary is part of the data
      return False, f"{folder} lacks {tff_text.WORD_COUNTS}: {tff_h5.how_to_get(name)}"
    return (True, folder) if folder else (False, tff_h5.how_to_get(name))
  return find


def _tff(name: str, class_names: tuple[str, ...] = ()) -> DatasetSource:
  return DatasetSource(name, lambda d, seed: tff_h5.load_tff(name, d), _find_tff(name),
                       class_names=class_names, natural_clients=True,
                       writers_test_split=tff_h5.same_test_clients(name))


def _tff_text(name: str) -> DatasetSource:
  """Token sequences (tff_text.py); `clients`: read only the ones natural_id takes."""
  return DatasetSource(name, lambda d, seed, clients=None: tff_text.load_tff_text(name, d, clients),
                       _find_tff(name), natural_clients=True, task=tff_text.task(name),
                       reads_chosen=True, writers_test_split=True)


def _find_cifar(data_dir):
  folder, _ = find_cifar_folder(data_dir)
  return (True, folder) if folder else (False, HOW_TO_GET["cifar10"])


_FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")
# FEMNIST's and EMNIST's 62 classes (LEAF and TFF number them so)
_EMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                  "ship", "truck")
# the registered datasets by name (a dict: iterating gives the names); register_dataset adds
DATASETS: dict[str, DatasetSource] = {s.name: s for s in (
    DatasetSource("digits", lambda d, seed: load_digits(seed), _found("scikit-learn (shipped)")),
    DatasetSource("mnist", lambda d, seed: load_idx_dataset("mnist", d), _find_idx("mnist")),
    DatasetSource("fmnist", lambda d, seed: load_idx_dataset("fmnist", d), _find_idx("fmnist"),
                  class_names=_FMNIST_CLASSES),
    DatasetSource("cifar10", lambda d, seed: load_cifar10(d), _find_cifar,
                  class_names=_CIFAR_CLASSES),
    # clients of their own (natural.py: partition natural_id); LEAF's JSON, TFF's HDF5
    DatasetSource("femnist", lambda d, seed: leaf.load_femnist(d), _find_leaf("femnist"),
                  class_names=_EMNIST_CLASSES, natural_clients=True, writers_test_split=True),
    DatasetSource("shakespeare", lambda d, seed: leaf.load_shakespeare(d),
                  _find_leaf("shakespeare"), natural_clients=True, writers_test_split=True),
    _tff("emnist", _EMNIST_CLASSES),
    _tff("emnist_digits", _EMNIST_CLASSES[:10]),
    _tff("cifar100"),
    _tff("cifar100_coarse"),
    _tff_text("shakespeare_tff"),
    _tff_text("stackoverflow"),
    DatasetSource("csv", lambda d, seed, **o: load_csv(seed=seed, **o),
                  _found("any CSV file: --set dataset=csv --set csv_path=FILE"), tabular=True),
    DatasetSource("synthetic", lambda d, seed, **o: load_synthetic(seed=seed, **o),
                  _found("generated on demand (any size)"), tabular=True),
    DatasetSource("healthcare", lambda d, seed, **o: load_healthcare(seed=seed, **o),
                  _found("generated on demand: 847 features in 4 groups with known tiers"),
                  tabular=True),
    DatasetSource("breast_cancer", lambda d, seed, **o: load_breast_cancer(seed, **o),
                  _found("scikit-learn (shipped)"), tabular=True,
                  class_names=("malignant", "benign")),   # scikit-learn's target_names
)}
# the datasets whose features are standardised (images are scaled to [0, 1] by a fixed
# rule); kept in step with DATASETS by register_dataset
TABULAR: list[str] = [name for name, s in DATASETS.items() if s.tabular]


def register_dataset(source: DatasetSource) -> None:
  """Adds `source` under its name (a new name, or the same source again)."""
  if not isinstance(source, DatasetSource):
    raise TypeError(f"register_dataset: {source!r} is not a DatasetSource")
  old = DATASETS.get(source.name)
  if source.name == "custom" or (old is not None and old != source):
    raise ValueError(f"register_dataset: {source.name!r} is already registered")
  DATASETS[source.name] = source
  if source.tabular and source.name not in TABULAR:
    TABULAR.append(source.name)


def natural_datasets() -> list[str]:
  """The registered datasets whose examples come with their own clients."""
  return [name for name, s in DATASETS.items() if s.natural_clients]


def default_task(name: str) -> losses.Task:
  """The task dataset `name`'s targets go with (DatasetSource.task), else classification."""
  source = DATASETS.get(name)
  return source.task if source is not None and source.task is not None else losses.CLASSIFICATION


def class_names(name: str) -> tuple[str, ...]:
  """The dataset's classes' names, () where it has none (digits and MNIST: the digit)."""
  return DATASETS[name].class_names if name in DATASETS else ()


def _source(name: str) -> DatasetSource:
  if name not in DATASETS:
    raise DataError(f"unknown dataset {name!r} (allowed: {', '.join(DATASETS)})")
  return DATASETS[name]


def find_dataset(name: str, data_dir: str | None = None) -> tuple[bool, str]:
  """(available here?, where it is or why not). Never raises for missing data."""
  return _source(name).find(data_dir)


def _load_raw(name: str, data_dir: str | None, seed: int, options: dict) -> Dataset:
  """The dataset as read: tabular features raw, in the loader's precision."""
  return _source(name).load(data_dir, seed, **options)


def load_dataset(name: str, data_dir: str | None = None, *, seed: int = 0,
                 feature_scaling: str | None = None, **options) -> Dataset:
  """Loads a dataset by name; options: csv (path, label_column, test_fraction, tier_map),
  synthetic (num_examples, num_features, num_classes), healthcare (num_examples, generator),
  breast_cancer (tier_map).

  feature_scaling (tabular datasets): 'pooled' (None: the default) or 'none', applied
  by `scale_features`; 'per_client' needs the partition: load with 'none', then
  `apply_feature_scaling` (experiment.setup.setup does both). Images take None or 'none'."""
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
