"""Datasets: numpy arrays plus metadata, from standard files or your own arrays.

The public names, each defined in the module that holds its concept:

  dataset.py    Dataset, DataError (one line), check_targets
  registry.py   DATASETS, TABULAR, register_dataset, find_dataset, load_dataset
  images.py     MNIST / Fashion-MNIST (IDX files: read_idx), CIFAR-10, digits
  csv_file.py   a CSV file as a classification dataset
  tabular.py    healthcare (known tiers), breast cancer, synthetic; tier maps
  scaling.py    FEATURE_SCALINGS, scale_features, apply_feature_scaling
  own_data.py   from_arrays(x, y, ...), from_clients([(x_i, y_i), ...])
  partition.py  splitting a dataset over clients

Images come back as float32 [N, H, W, C] in [0, 1]; tabular data as float32
[N, d], scaled by `scale_features` as `feature_scaling` says: 'pooled' (the
default of `load_dataset`: the training set's mean and deviation) or 'none'
(raw). 'per_client' needs the partition, so `experiment.setup.setup` applies it
after partitioning. Labels are int32 [N] in 0..num_classes-1.

Your own data: `from_arrays(x, y, ...)` and `from_clients([(x_i, y_i), ...])`
check it and return a Dataset that carries its own client partition
(`client_parts`); integer targets stay int32 class labels, real targets
float32 (regression), from here to the store and the evaluation.
"""

from fedjax_dp.data.dataset import Dataset, check_targets
from fedjax_dp.errors import DataError
from fedjax_dp.data.images import (DEBIAN_FMNIST, IDX_FILES, IMAGE_MAGIC, LABEL_MAGIC,
                                   read_idx)
from fedjax_dp.data.own_data import from_arrays, from_clients
from fedjax_dp.data.registry import (DATASETS, TABULAR, DatasetSource, find_dataset,
                                     load_dataset, register_dataset)
from fedjax_dp.data.scaling import FEATURE_SCALINGS, apply_feature_scaling, scale_features

__all__ = ["DATASETS", "DEBIAN_FMNIST", "DataError", "Dataset", "DatasetSource",
           "FEATURE_SCALINGS", "IDX_FILES", "IMAGE_MAGIC", "LABEL_MAGIC", "TABULAR",
           "apply_feature_scaling", "check_targets", "find_dataset", "from_arrays",
           "from_clients", "load_dataset", "read_idx", "register_dataset", "scale_features"]
