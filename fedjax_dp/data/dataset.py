"""The Dataset every loader returns, its one-line DataError, and what loaders share.

A Dataset holds numpy arrays plus metadata: images as float32 [N, H, W, C] in
[0, 1], tabular data as float32 [N, d], labels as int32 [N] in
0..num_classes-1, or, for your own data (own_data.py), real targets as float32
[N] or [N, k] (num_classes 0). Its test set's provenance is `test_source`: a
loader's split ('split'), the caller's ('given') or the clients' own rows
('client_rows', refused under a privacy guarantee: experiment/setup.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.errors import DataError  # noqa: F401  (its old home)


TEST_SOURCES = ("split", "given", "client_rows")   # Dataset.test_source


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
  # how x_train and x_test were standardised (scaling.FEATURE_SCALINGS); images: 'none'
  feature_scaling: str = "none"
  # the data's own split over clients (from_arrays, from_clients): one index array
  # into x_train per client; None: the config's `partition` splits the data
  client_parts: tuple[np.ndarray, ...] | None = None
  # data with clients of its own (natural.py: LEAF, TensorFlow Federated's files):
  # their ids, in client_parts' order, and each one's rows of x_test where the test
  # split holds the same clients' examples (None: no trained client's rows)
  client_ids: tuple[str, ...] = ()
  test_parts: tuple[np.ndarray, ...] | None = None
  # how a run took those clients (experiment/setup.natural_clients: the partition,
  # num_clients, test_clients, data seed), so that taking them again is a no-op
  clients_taken: str = ""
  # where x_test, y_test came from (TEST_SOURCES): 'split', a loader's test split or
  # rows held out before partitioning (no client's); 'given', the caller's
  # test=(x_test, y_test); 'client_rows', rows held out of the clients' own rows,
  # whose test metrics a privacy guarantee does not cover (setup refuses them under DP)
  test_source: str = "split"

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_train.shape[1:])

  @property
  def output_size(self) -> int:
    """Outputs a built-in model needs: the classes, or the target's width (1 for [N])."""
    return self.num_classes or int(np.prod(self.y_train.shape[1:], dtype=np.int64))


def train_test_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(training rows, test rows) of n: a seeded permutation, round(n test_fraction) (at
  least one) rows for the test set."""
  perm = np.random.default_rng(seed).permutation(n)
  n_test = max(1, int(round(n * test_fraction)))
  return perm[n_test:], perm[:n_test]


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
