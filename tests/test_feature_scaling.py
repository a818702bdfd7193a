"""feature_scaling: pooled standardisation lets one client's data move every
client's inputs (issue 18, finding 7); per_client keeps each client's inputs a
function of its own rows, and is the default under DP. dp 'none' keeps the
pooled numbers bit for bit."""

import dataclasses
import json

import numpy as np
import pytest

from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.data import apply_feature_scaling, load_dataset, scale_features
from fedjax_dp.errors import DataError
from fedjax_dp.data.dataset import train_test_split
from fedjax_dp.data.partition import partition
from fedjax_dp.experiment.reports import privacy_report
from fedjax_dp.experiment import runner
from fedjax_dp.experiment.setup import load_data, setup


def _problem(seed=0, n=300, d=5, clients=6):
  """Raw features of mixed scales (one constant column), labels and a partition."""
  rng = np.random.default_rng(seed)
  x = (rng.normal(size=(n, d)) * [1, 10, 1e3, 0.1, 0] + [0, 5, 1e4, -3, 7]).astype(np.float32)
  y = rng.integers(0, 3, size=n).astype(np.int32)
  parts = partition(y, clients, "dirichlet", alpha=0.5, seed=seed)
  x_test = (rng.normal(size=(40, d)) * 2 + 1).astype(np.float32)
  return x, y, parts, x_test


def _loop(x, parts, x_test):
  """per_client, the plain way: each client's rows with their own mean and deviation."""
  out = x.copy()
  for p in parts:
    rows = x[p].astype(np.float64)
    std = rows.std(0)
    out[p] = ((rows - rows.mean(0)) / np.where(std > 0, std, 1.0)).astype(np.float32)
  t = x_test.astype(np.float64)
  std = t.std(0)
  return out, ((t - t.mean(0)) / np.where(std > 0, std, 1.0)).astype(np.float32)


def test_per_client_equals_a_loop_over_clients():
  x, _, parts, x_test = _problem()
  parts = parts[:-1] + [parts[-1][:1]]    # a one-row client: all its features become 0
  got_train, got_test = scale_features(x, x_test, parts, "per_client")
  want_train, want_test = _loop(x, parts, x_test)
  assert got_train.dtype == got_test.dtype == np.float32
  np.testing.assert_array_equal(got_train, want_train)
  np.testing.assert_array_equal(got_test, want_test)
  for p in parts[:-1]:
    np.testing.assert_allclose(got_train[p].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(got_train[p][:, :4].std(0), 1, atol=1e-5)
  assert not got_train[parts[-1]].any()
  np.testing.assert_array_equal(scale_features(x, x_test, parts, "none")[0], x)


def _neighbour(x, parts, k=2):
  """The same clients, client k's rows replaced by other data."""
  x2 = x.copy()
  x2[parts[k]] = x[parts[k]] * 3 + 50
  return x2, k


def _assert_others_unchanged(mode):
  x, _, parts, x_test = _problem(seed=1)
  x2, k = _neighbour(x, parts)
  a_train, a_test = scale_features(x, x_test, parts, mode)
  b_train, b_test = scale_features(x2, x_test, parts, mode)
  assert not np.array_equal(a_train[parts[k]], b_train[parts[k]])   # client k did change
  for j, p in enumerate(parts):
    if j != k:
      np.testing.assert_array_equal(a_train[p], b_train[p], err_msg=f"client {j} moved")
  np.testing.assert_array_equal(a_test, b_test, err_msg="the test set moved")


def test_a_neighbour_moves_only_its_own_client_under_per_client():
  _assert_others_unchanged("per_client")
  _assert_others_unchanged("none")


def test_a_neighbour_moves_every_client_under_pooled():
  """The finding: the same check fails for pooled statistics."""
  with pytest.raises(AssertionError, match="moved"):
    _assert_others_unchanged("pooled")
  x, _, parts, x_test = _problem(seed=1)
  x2, k = _neighbour(x, parts)
  a, b = (scale_features(v, x_test, parts, "pooled")[0] for v in (x, x2))
  assert all(not np.array_equal(a[p], b[p]) for j, p in enumerate(parts) if j != k)


def test_setup_scales_per_client_after_partitioning():
  """Under DP, auto -> per_client: setup's data (and the store the rounds read) are
  each client's rows standardised alone, from the raw features; a neighbour dataset
  leaves every other client's rows of the store bit-identical."""
  cfg = make_config(dict(dataset="breast_cancer", dp="central", noise_multiplier=1.0,
                         num_clients=8, clients_per_round=4, hidden=[8], devices=1))
  assert privacy_report.resolved_feature_scaling(cfg) == "per_client"
  raw = load_data(cfg)
  assert raw.feature_scaling == "none"
  np.testing.assert_array_equal(raw.x_train, load_dataset("breast_cancer",
                                                          feature_scaling="none").x_train)
  ds, parts, sim = setup(cfg)
  assert ds.feature_scaling == "per_client"
  want_train, want_test = _loop(raw.x_train, parts, raw.x_test)
  np.testing.assert_array_equal(ds.x_train, want_train)
  np.testing.assert_array_equal(ds.x_test, want_test)
  np.testing.assert_array_equal(np.asarray(sim.store.x), want_train)
  x2, k = _neighbour(raw.x_train, parts)
  ds2, parts2, sim2 = setup(cfg, dataclasses.replace(raw, x_train=x2))
  assert all(np.array_equal(a, b) for a, b in zip(parts, parts2))
  store, store2 = np.asarray(sim.store.x), np.asarray(sim2.store.x)
  for j, p in enumerate(parts):
    assert np.array_equal(store[p], store2[p]) == (j != k)


def test_auto_resolution_and_not_accounted():
  resolved = lambda **kw: privacy_report.resolved_feature_scaling(make_config(kw))
  assert resolved(dataset="healthcare") == "pooled"
  assert resolved(dataset="healthcare", dp="central", noise_multiplier=1.0) == "per_client"
  assert resolved(dataset="breast_cancer", dp="local", noise_multiplier=1.0) == "per_client"
  assert resolved(dataset="digits") == resolved(dataset="digits", dp="local",
                                                noise_multiplier=1.0) == "none"
  assert resolved(dataset="synthetic", feature_scaling="none", dp="central",
                  noise_multiplier=1.0) == "none"
  dp = dict(dataset="healthcare", dp="central", noise_multiplier=1.0)
  assert privacy_report.data_not_accounted(make_config({"dataset": "healthcare"})) == []
  assert privacy_report.data_not_accounted(make_config(dp)) == []
  assert privacy_report.data_not_accounted(make_config(dict(dp, feature_scaling="per_client"))) == []
  assert privacy_report.data_not_accounted(make_config(dict(dp, feature_scaling="none"))) == []
  lines = privacy_report.data_not_accounted(make_config(dict(dp, feature_scaling="pooled")))
  assert len(lines) == 1 and "every client's raw training data" in lines[0]
  assert "not covered by epsilon" in lines[0] and "\n" not in lines[0]
  assert privacy_report.data_not_accounted(make_config(dict(dp, dp="local", feature_scaling="pooled")))


@pytest.mark.parametrize("overrides, fragment", [
    ({"feature_scaling": "global"},
     "config key 'feature_scaling' = 'global': allowed values are auto, pooled, per_client, none"),
    ({"dataset": "digits", "feature_scaling": "pooled"},
     "config key 'feature_scaling' = 'pooled' with dataset 'digits': images are scaled"),
    ({"dataset": "fmnist", "feature_scaling": "none"},
     "config key 'feature_scaling' = 'none' with dataset 'fmnist'"),
    ({"dataset": "cifar10", "feature_scaling": "per_client"}, "only csv, synthetic, healthcare"),
])
def test_config_errors(overrides, fragment):
  with pytest.raises(ConfigError) as e:
    make_config(overrides)
  assert fragment in str(e.value) and "\n" not in str(e.value)
  make_config({"dataset": "digits", "feature_scaling": "auto"})


def test_loader_and_setup_errors():
  for call, fragment in (
      (lambda: load_dataset("digits", feature_scaling="pooled"), "images are scaled"),
      (lambda: load_dataset("breast_cancer", feature_scaling="per_client"), "needs the partition"),
      (lambda: scale_features(np.zeros((2, 1)), np.zeros((1, 1)), None, "per_client"),
       "needs the partition"),
      (lambda: scale_features(np.zeros((2, 1)), np.zeros((1, 1)), [[0, 1], [1]], "per_client"),
       "must be disjoint"),
      (lambda: scale_features(np.zeros((2, 1)), np.zeros((1, 1)), None, "minmax"),
       "allowed values are pooled, per_client, none"),
      # pooled-standardised data cannot be made per-client (the pooled statistics are in it)
      (lambda: setup(make_config(dict(dataset="breast_cancer", dp="central",
                                      noise_multiplier=1.0)),
                     load_dataset("breast_cancer")),
       "loaded with feature_scaling 'pooled' but the config resolves it to 'per_client'")):
    with pytest.raises(DataError) as e:
      call()
    assert fragment in str(e.value) and "\n" not in str(e.value)
  ds = load_dataset("digits", feature_scaling="none")
  assert ds.feature_scaling == "none" and apply_feature_scaling(ds, [], "none") is ds


def _old_standardize(train, test):
  """The loaders' standardisation before feature_scaling existed."""
  mean, std = train.mean(0), train.std(0)
  std = np.where(std > 0, std, 1.0)
  return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def test_dp_none_keeps_the_pooled_numbers(tmp_path):
  """dp 'none' (auto -> pooled) gives the same arrays as before, bit for bit, for
  every tabular dataset; csv from its float64 values, the rest from float32."""
  rng = np.random.default_rng(5)
  path = tmp_path / "t.csv"
  rows = [(rng.normal(1e6, 3e3), rng.integers(0, 5), rng.exponential(2), i % 3)
          for i in range(120)]
  path.write_text("a,b,c,label\n" + "".join(f"{a:.6f},{b},{c:.9f},{l}\n" for a, b, c, l in rows))
  x64 = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 1, 2))
  tr, te = train_test_split(len(x64), 0.2, 0)
  cases = {"csv": ({"csv_path": str(path)}, x64[tr], x64[te]),
           "synthetic": ({"synthetic_examples": 400}, None, None),
           "healthcare": ({"healthcare_examples": 300}, None, None),
           "breast_cancer": ({}, None, None)}
  for name, (extra, raw_train, raw_test) in cases.items():
    cfg = make_config(dict(extra, dataset=name, num_clients=5, clients_per_round=5, hidden=[4],
                           devices=1))
    assert privacy_report.resolved_feature_scaling(cfg) == "pooled"
    if raw_train is None:
      raw = load_data(make_config({"feature_scaling": "none"}, cfg))
      assert raw.x_train.dtype == np.float32   # these loaders' raw precision: the cast is exact
      raw_train, raw_test = raw.x_train, raw.x_test
    want_train, want_test = _old_standardize(raw_train, raw_test)
    ds, _, sim = setup(cfg)
    assert ds.feature_scaling == "pooled"
    np.testing.assert_array_equal(ds.x_train, want_train, err_msg=name)
    np.testing.assert_array_equal(ds.x_test, want_test, err_msg=name)
    np.testing.assert_array_equal(np.asarray(sim.store.x), want_train, err_msg=name)
    loaded = load_dataset(name, **({"path": str(path)} if name == "csv" else {}),
                          **{"synthetic": {"num_examples": 400},
                             "healthcare": {"num_examples": 300}}.get(name, {}))
    np.testing.assert_array_equal(loaded.x_train, want_train, err_msg=name)   # the default


def test_runs_saved_before_the_key_count_as_pooled(tmp_path):
  """A run folder written before feature_scaling existed was standardised pooled: a
  sweep pinned to pooled (or dp none on auto) reuses it; a DP config on auto (now
  per_client) is told the settings differ instead of reusing a pooled run."""
  dp = make_config(dict(dataset="healthcare", dp="central", noise_multiplier=1.0))
  for cfg, reused in ((make_config({"feature_scaling": "pooled"}, dp), True), (dp, False),
                      (make_config({"dataset": "healthcare"}), True)):
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    legacy = cfg.to_dict()
    del legacy["feature_scaling"]
    (out / "config.json").write_text(json.dumps(legacy))
    (out / "summary.json").write_text('{"reused": true}')
    if reused:
      assert runner.run_or_reuse(cfg, str(out)) == {"reused": True}
    else:
      with pytest.raises(runner.RunError,
                         match=r"feature_scaling 'pooled' there, 'auto' \(per_client\) asked"):
        runner.run_or_reuse(cfg, str(out))
