"""The built-in datasets by name: DATASETS, TABULAR, `find_dataset` and `load_dataset`.

`load_dataset` reads a dataset (images.py, csv_file.py, tabular.py) and, for
tabular data, scales its features as `feature_scaling` says (scaling.py):
'pooled' (the default) or 'none'.
"""

from __future__ import annotations

import dataclasses
import os

from fedjax_dp.data.csv_file import load_csv
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.errors import DataError
from fedjax_dp.data.images import (HOW_TO_GET, find_cifar_folder, find_idx_folder,
                                   load_cifar10, load_digits, load_idx_dataset)
from fedjax_dp.data.scaling import scale_features
from fedjax_dp.data.tabular import load_breast_cancer, load_healthcare, load_synthetic

DATASETS = ("digits", "mnist", "fmnist", "cifar10", "csv", "synthetic", "healthcare",
            "breast_cancer")
# the classes' names where the dataset has them (digits and MNIST: the digit itself)
CLASS_NAMES = {
    "fmnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
    "breast_cancer": ("malignant", "benign"),   # scikit-learn's target_names
}
# the datasets whose features are standardised (images are scaled to [0, 1] by a fixed rule)
TABULAR = ("csv", "synthetic", "healthcare", "breast_cancer")


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
    folder, _ = find_idx_folder(name, data_dir)
    return (True, folder) if folder else (False, HOW_TO_GET[name])
  if name == "cifar10":
    folder, _ = find_cifar_folder(data_dir)
    return (True, folder) if folder else (False, HOW_TO_GET[name])
  raise DataError(f"unknown dataset {name!r} (allowed: {', '.join(DATASETS)})")


def _load_raw(name: str, data_dir: str | None, seed: int, options: dict) -> Dataset:
  """The dataset as read: tabular features raw, in the loader's precision."""
  if name == "digits":
    return load_digits(seed)
  if name in ("mnist", "fmnist"):
    return load_idx_dataset(name, data_dir)
  if name == "cifar10":
    return load_cifar10(data_dir)
  if name == "csv":
    return load_csv(seed=seed, **options)
  if name == "synthetic":
    return load_synthetic(seed=seed, **options)
  if name == "healthcare":
    return load_healthcare(seed=seed, **options)
  if name == "breast_cancer":
    return load_breast_cancer(seed, **options)
  raise DataError(f"unknown dataset {name!r} (allowed: {', '.join(DATASETS)})")


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
