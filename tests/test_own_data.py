"""data.from_arrays and data.from_clients: partitions against manual construction, targets
kept as they are, and one-line errors naming the bad value."""

import numpy as np
import pytest

from fedjax_dp import data
from fedjax_dp.data import DataError, from_arrays, from_clients
from fedjax_dp.data.partition import partition


def _xy(n=40, d=3, seed=0, real=True):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  x[:, 0] = np.arange(n)                      # a row's id, to follow it through the split
  y = rng.normal(size=n) + 0.5 if real else rng.integers(0, 4, size=n)
  return x, y


def _row_ids(x):
  return x[:, 0].astype(int)


def test_client_ids_give_one_client_per_sorted_id_and_keep_real_targets():
  x, y = _xy()
  ids = np.array(["b", "a", "c", "a"] * 10)
  xt, yt = _xy(7, seed=1)
  ds = from_arrays(x, y, client_ids=ids, test=(xt, yt))
  np.testing.assert_array_equal(ds.x_train, x)      # every row trains, in order
  assert [list(p) for p in ds.client_parts] == [list(np.flatnonzero(ids == c)) for c in "abc"]
  assert ds.y_train.dtype == np.float32 and ds.num_classes == 0 and ds.output_size == 1
  np.testing.assert_array_equal(ds.y_train, y.astype(np.float32))   # fractions, not ints
  np.testing.assert_array_equal(ds.x_test, xt)
  assert ds.source == "from_arrays" and ds.name == "arrays"


def test_test_fraction_holds_out_floor_f_n_of_each_client():
  x, y = _xy(n=53)
  ids = np.r_[np.zeros(4, int), np.ones(30, int), np.full(19, 7)]
  ds = from_arrays(x, y, client_ids=ids, test_fraction=0.25, seed=3)
  test_rows = set(_row_ids(ds.x_test))
  for k, client in enumerate((0, 1, 7)):
    own = set(np.flatnonzero(ids == client))
    train = set(_row_ids(ds.x_train[ds.client_parts[k]]))
    held = own & test_rows
    assert train | held == own and not train & held and train
    assert len(held) == int(np.floor(0.25 * len(own)))
  # targets follow their rows
  np.testing.assert_array_equal(ds.y_train, y.astype(np.float32)[_row_ids(ds.x_train)])
  again = from_arrays(x, y, client_ids=ids, test_fraction=0.25, seed=3)
  other = from_arrays(x, y, client_ids=ids, test_fraction=0.25, seed=4)
  np.testing.assert_array_equal(again.x_test, ds.x_test)
  assert set(_row_ids(other.x_test)) != test_rows


def test_index_lists_and_from_clients_match_manual_construction():
  x, y = _xy(real=False)
  parts = [np.arange(0, 40, 3), np.arange(1, 40, 3), np.arange(2, 40, 3)]
  xt, yt = _xy(5, seed=2, real=False)
  ds = from_arrays(x, y, partition=parts, test=(xt, yt))
  for p, q in zip(parts, ds.client_parts):
    np.testing.assert_array_equal(ds.x_train[q], x[p])
  assert ds.y_train.dtype == np.int32 and ds.num_classes == 4 == ds.output_size
  cl = from_clients([(x[p], y[p]) for p in parts], test=(xt, yt))
  for p, q in zip(parts, cl.client_parts):
    np.testing.assert_array_equal(cl.x_train[q], x[p])
    np.testing.assert_array_equal(cl.y_train[q], y[p])
  assert cl.source == "from_clients (3 clients)"


def test_a_partition_name_splits_the_rows_left_after_the_test_split():
  x, y = _xy(n=60, real=False)
  ds = from_arrays(x, y, partition="dirichlet", num_clients=4, alpha=1.0, test_fraction=0.2,
                   seed=5)
  train, test = data._split(60, 0.2, 5)
  want = partition(y[train], 4, "dirichlet", alpha=1.0, seed=5)
  np.testing.assert_array_equal(np.sort(_row_ids(ds.x_test)), np.sort(test))
  for p, q in zip(want, ds.client_parts):
    np.testing.assert_array_equal(np.sort(_row_ids(ds.x_train[q])), np.sort(train[p]))
  iid = from_arrays(*_xy(n=60), partition="iid", num_clients=6, seed=5)
  assert sorted(len(p) for p in iid.client_parts) == [8] * 6 and len(iid.x_test) == 12


def test_check_targets_names_the_loss_and_the_fix():
  reg = from_arrays(*_xy(), client_ids=np.arange(40) % 2)
  cls = from_arrays(*_xy(real=False), client_ids=np.arange(40) % 2)
  data.check_targets(reg, "float32", "regression")
  data.check_targets(cls, "int32", "classification")
  data.check_targets(reg, None, "mine")
  with pytest.raises(DataError, match="targets are float32 but loss 'classification' takes int32"):
    data.check_targets(reg, "int32", "classification")
  with pytest.raises(DataError, match="targets are int32 class labels but loss 'regression'"):
    data.check_targets(cls, "float32", "regression")


X, Y = _xy()
IDS = np.arange(40) % 4
NAN_X = X.copy()
NAN_X[5, 1] = np.nan
INF_Y = Y.copy()
INF_Y[9] = np.inf


@pytest.mark.parametrize("call, message", [
    (lambda: from_arrays(X, Y[:30], client_ids=IDS), "y has 30 rows but x has 40"),
    (lambda: from_arrays(NAN_X, Y, client_ids=IDS), "x row 5 holds nan"),
    (lambda: from_arrays(X, INF_Y, client_ids=IDS), "y row 9 is not a finite number"),
    (lambda: from_arrays(X[:, 0], Y, client_ids=IDS), r"x has shape \(40,\): expected \[N, "),
    (lambda: from_arrays(X, Y.astype(str), client_ids=IDS), "y has dtype <U"),
    (lambda: from_arrays(X, -np.ones(40, int), client_ids=IDS), "y holds class label -1"),
    (lambda: from_arrays(X, Y, client_ids=IDS[:10]), r"client_ids has shape \(10,\)"),
    (lambda: from_arrays(X, Y, client_ids=IDS + 0.5), "client_ids holds non-integer"),
    (lambda: from_arrays(X, Y), "give exactly one of client_ids"),
    (lambda: from_arrays(X, Y, client_ids=IDS, partition="iid"), "give exactly one of"),
    (lambda: from_arrays(X, Y, client_ids=IDS, test=(X, Y), test_fraction=0.1),
     "test=.* or test_fraction, not both"),
    (lambda: from_arrays(X, Y, client_ids=IDS, test_fraction=1.5), "test_fraction 1.5"),
    (lambda: from_arrays(X, Y, client_ids=np.arange(40), test_fraction=0.2),
     "test_fraction 0.2 holds out no row"),
    (lambda: from_arrays(X, Y, client_ids=IDS, test=(X[:, :2], Y)),
     r"test x has rows of shape \(2,\) but x has \(3,\)"),
    (lambda: from_arrays(X, Y, client_ids=IDS, test=(X, IDS)),
     "test y is int32 .* but y is float32"),
    (lambda: from_arrays(X, Y, partition=[np.arange(20), np.arange(15, 40)]),
     "row 15 is in 2 clients' parts"),
    (lambda: from_arrays(X, Y, partition=[np.arange(20), np.arange(20, 41)]),
     r"partition\[1\] holds row 40: indices must be in 0..39"),
    (lambda: from_arrays(X, Y, partition=[np.arange(40), []]), r"partition\[1\] is empty"),
    (lambda: from_arrays(X, Y, partition="dirichlet", num_clients=3),
     "partition 'dirichlet' splits by class label but y holds real targets"),
    (lambda: from_arrays(X, Y, partition="iid"), "partition 'iid' needs num_clients >= 1"),
    (lambda: from_arrays(X, Y, partition="iid", num_clients=2, beta=1),
     "unknown option 'beta'"),
    (lambda: from_arrays(X, Y, client_ids=IDS, num_clients=4), "num_clients go with a partition"),
    (lambda: from_clients([(X[:5], Y[:5]), (X[:0], Y[:0])]), "client 1 has no rows"),
    (lambda: from_clients([(X[:5], Y[:5]), (X[:5, :2], Y[:5])]),
     r"client 1 has x rows \(2,\)"),
    (lambda: from_clients([]), "no clients"),
])
def test_bad_data_is_a_one_line_error_naming_the_value(call, message):
  with pytest.raises(DataError, match=message) as e:
    call()
  assert "\n" not in str(e.value)
