"""data.from_arrays and data.from_clients: partitions against manual construction, targets
kept as they are, one-line errors naming the bad value, and where the test set came
from (test_source): a run under DP refuses a holdout of the clients' own rows."""

import dataclasses

import jax
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import data
from fedjax_dp.data import from_arrays, from_clients
from fedjax_dp.errors import DataError
from fedjax_dp.data.dataset import train_test_split
from fedjax_dp.data.partition import partition
from fedjax_dp.experiment.setup import setup


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


def test_a_float32_x_whose_rows_all_train_is_not_copied_and_a_late_bad_value_is_found():
  """A big float32 x (FEMNIST's 2.4 GB) is the Dataset's x_train itself, not a copy;
  an int x, or a holdout of its rows, is copied. The finiteness check reads x in
  chunks, and a non-finite value past the first chunk is named by its own row."""
  x, y = _xy(n=40, real=False)
  x = x.astype(np.float32)
  parts = [np.arange(0, 40, 2), np.arange(1, 40, 2)]
  xt, yt = _xy(5, seed=2, real=False)
  ds = from_arrays(x, y, partition=parts, test=(xt, yt))
  assert ds.x_train is x
  held = from_arrays(x, y, partition=parts)   # a fifth of each client's rows held out
  assert not np.shares_memory(held.x_train, x)
  assert not np.shares_memory(from_arrays(x.astype(np.int64), y, partition=parts,
                                          test=(xt, yt)).x_train, x)
  big = np.zeros((20_000, 1_000), np.float32)   # 80 MB: two chunks of 64 MB
  big[19_000, 7] = np.nan
  with pytest.raises(DataError, match=r"^x row 19000 holds nan \(as float32\)"):
    from_arrays(big, np.zeros(20_000, np.int32), client_ids=np.arange(20_000) % 4)


def test_a_partition_name_splits_the_rows_left_after_the_test_split():
  x, y = _xy(n=60, real=False)
  ds = from_arrays(x, y, partition="dirichlet", num_clients=4, alpha=1.0, test_fraction=0.2,
                   seed=5)
  train, test = train_test_split(60, 0.2, 5)
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


# --- test_source, and the refusal of a holdout of the clients' own rows under DP ---------

FAST = dict(rounds=1, hidden=[4], batch_size=4, clients_per_round=3, lr=0.1, devices=1)
# the runs with a privacy guarantee, and the name the refusal gives each
GUARANTEES = [
    (dict(dp="central", noise_multiplier=1.0), "dp 'central'"),
    (dict(dp="local", noise_multiplier=1.0), "dp 'local'"),
    (dict(s_local=0.5, kept_noise="multiplier", kept_noise_multiplier=1.0, final_clip_l2=1.0),
     "kept_noise 'multiplier'"),
]


def _blobs(clients=3, n=8, extra=0, seed=0):
  """(x [clients n + extra, 4] float32, y int32 in 0..2, client ids of the first
  clients n rows): three Gaussian classes."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 3, size=clients * n + extra).astype(np.int32)
  x = (2 * rng.normal(size=(3, 4))[y] + rng.normal(size=(len(y), 4))).astype(np.float32)
  return x, y, np.arange(clients * n) % clients


def _held_out(x, y, ids, seed=0):
  """from_arrays with the default holdout: a quarter of each client's own rows."""
  return from_arrays(x, y, client_ids=ids, test_fraction=0.25, seed=seed, name="blobs")


def test_test_source_says_where_the_test_set_came_from():
  x, y, ids = _blobs(extra=6)
  xc, yc = x[:24], y[:24]
  given = (x[24:], y[24:])
  parts = [np.flatnonzero(ids == k) for k in range(3)]
  cases = {
      "client_rows": [from_arrays(xc, yc, client_ids=ids),
                      from_arrays(xc, yc, client_ids=ids, test_fraction=0.25),
                      from_arrays(xc, yc, partition=parts, test_fraction=0.25),
                      from_clients([(xc[p], yc[p]) for p in parts]),
                      from_clients([(xc[p], yc[p]) for p in parts], test_fraction=0.25)],
      "given": [from_arrays(xc, yc, client_ids=ids, test=given),
                from_arrays(xc, yc, partition=parts, test=given),
                from_arrays(xc, yc, partition="iid", num_clients=3, test=given),
                from_clients([(xc[p], yc[p]) for p in parts], test=given)],
      "split": [from_arrays(x, y, partition="iid", num_clients=3),
                from_arrays(x, y, partition="dirichlet", num_clients=3, alpha=1.0,
                            test_fraction=0.2),
                data.load_dataset("synthetic", None, seed=0, num_examples=40, num_features=4,
                                  num_classes=3)],
  }
  for want, datasets in cases.items():
    assert [ds.test_source for ds in datasets] == [want] * len(datasets)
  assert set(cases) == set(data.dataset.TEST_SOURCES)
  assert data.Dataset("d", x, y, x, y, 3, "here").test_source == "split"   # the default
  # setup's feature scaling (dataclasses.replace) keeps it
  from fedjax_dp.api import recipe_config
  ds, _, _ = setup(recipe_config("fedavg", data=cases["given"][0], **FAST), cases["given"][0])
  assert ds.test_source == "given"


@pytest.mark.parametrize("guarantee, named", GUARANTEES, ids=["central", "local", "kept"])
def test_a_run_under_dp_refuses_a_test_set_of_the_clients_own_rows(guarantee, named, tmp_path):
  """The holdout's test_loss and accuracy are published unnoised: under a guarantee
  they would release the clients' rows outside it. Refused in one line, naming the
  value, why and the fix, before the output folder is made."""
  ds = _held_out(*_blobs())
  message = (rf"^data 'blobs' has test_source 'client_rows' .* with {named}: the published "
             r"test_loss and test metrics would be unnoised functions of those clients' rows, "
             r"outside the privacy guarantee; .*pass test=\(x_test, y_test\) of data that is no "
             r"client's, or a partition by name with test_fraction")
  with pytest.raises(DataError, match=message) as e:
    fedjax_dp.simulate("fedavg", data=ds, **FAST, **guarantee)
  assert "\n" not in str(e.value)
  out = tmp_path / "run"
  with pytest.raises(DataError, match=message):
    fedjax_dp.run("fedavg", data=ds, out=str(out), progress=False, **FAST, **guarantee)
  assert not out.exists()
  with pytest.raises(DataError, match=message):
    fedjax_dp.profile("fedavg", data=ds, out=str(tmp_path / "profile"), **FAST, **guarantee)
  assert not (tmp_path / "profile").exists()
  from_clients_ds = from_clients([(ds.x_train[p], ds.y_train[p]) for p in ds.client_parts])
  with pytest.raises(DataError, match=message.replace("'blobs'", "'clients'")):
    fedjax_dp.simulate("fedavg", data=from_clients_ds, **FAST, **guarantee)


def test_a_sweep_with_a_dp_cell_refuses_the_clients_own_rows_before_any_cell_runs(tmp_path):
  ds = _held_out(*_blobs())
  spec = {"config": {**FAST, "dp": "central", "noise_multiplier": 1.0}, "seeds": 1}
  with pytest.raises(DataError, match="test_source 'client_rows' .* with dp 'central'"):
    fedjax_dp.sweep(spec, out=str(tmp_path / "s"), data=ds, progress=False, log=lambda m: None)
  assert not (tmp_path / "s").exists()   # refused before anything is written


def test_dp_none_keeps_the_holdout_of_the_clients_own_rows():
  sim = fedjax_dp.simulate("fedavg", data=_held_out(*_blobs()), **FAST)   # no guarantee
  state, _ = sim.run_rounds(sim.init_state(), 1)
  assert np.isfinite(sim.evaluate(state.params, *sim.test_data)["loss"])


@pytest.mark.parametrize("guarantee", [g for g, _ in GUARANTEES], ids=["central", "local", "kept"])
def test_under_dp_a_given_test_set_and_a_partition_names_holdout_run(guarantee):
  """test=(x, y) of rows no client holds, and a partition name's test_fraction (held out
  before partitioning): the test set is no client's, so the guarantee stands."""
  x, y, ids = _blobs(extra=6)
  given = from_arrays(x[:24], y[:24], client_ids=ids, test=(x[24:], y[24:]))
  by_name = from_arrays(x, y, partition="iid", num_clients=3, test_fraction=0.2)
  for ds in (given, by_name):
    sim = fedjax_dp.simulate("fedavg", data=ds, **FAST, **guarantee)
    assert sim.cfg.dp == guarantee.get("dp", "none") and sim.cfg.kept_noise == guarantee.get(
        "kept_noise", "none")
  state, _ = sim.run_rounds(sim.init_state(), 1)
  assert np.isfinite(sim.evaluate(state.params, *sim.test_data)["loss"])


def test_a_bad_test_source_is_refused_in_one_line():
  ds = dataclasses.replace(_held_out(*_blobs()), test_source="clients")
  with pytest.raises(DataError, match="^data 'blobs' has test_source 'clients': allowed are "
                                      "'split', 'given', 'client_rows'$"):
    fedjax_dp.simulate("fedavg", data=ds, **FAST)


def test_the_holdout_leaks_one_clients_row_that_the_model_never_saw():
  """Why the refusal: with dp none (where the holdout is allowed), changing one
  held-out row of one client leaves every trained model bit-identical and moves the
  published test_loss. Under DP the same run would publish that move unnoised."""
  x, y, ids = _blobs()
  ds = _held_out(x, y, ids)
  row = int(np.flatnonzero((x == ds.x_test[0]).all(axis=1))[0])   # held out of its client
  x2 = x.copy()
  x2[row] += 5.0
  ds2 = _held_out(x2, y, ids)
  np.testing.assert_array_equal(ds2.x_train, ds.x_train)   # the same split: training unchanged
  for a, b in zip(ds.client_parts, ds2.client_parts):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(ds2.x_test, ds.x_test)
  results = []
  for d in (ds, ds2):
    sim = fedjax_dp.simulate("fedavg", data=d, **FAST)
    state, _ = sim.run_rounds(sim.init_state(), 1)
    results.append((state.params, sim.evaluate(state.params, *sim.test_data)))
  (p1, m1), (p2, m2) = results
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))   # the released model
  assert float(m1["loss"]) != float(m2["loss"])                   # the published metric
