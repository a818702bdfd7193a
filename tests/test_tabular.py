"""Tabular data with sensitivity tiers: the synthetic healthcare cohort, the shipped
breast-cancer set, and CSV input with a tier map."""

import json

import numpy as np
import pytest

from fedjax_dp.data import tabular
from fedjax_dp.data import load_dataset
from fedjax_dp.errors import DataError


def test_healthcare_groups_tiers_and_signal():
  x, y, tiers, names, sensitive = tabular.healthcare_data(3000, seed=1)
  assert x.shape == (3000, 847) and len(names) == 847 and len(set(names)) == 847
  # the groups of SPEC B.7 and the demographic mix, counted by hand
  assert np.bincount(tiers, minlength=5).tolist() == [305 + 10, 178 + 12, 322 + 10, 6, 4]
  assert set(np.unique(x[:, :305])) <= {0.0, 1.0, 2.0}            # genotypes
  assert x[:, 305:483].min() >= 0 and x[:, 305:483].max() <= 40   # bounded scores
  assert np.all(x[:, 525:] > 0)                                    # log-normal imaging
  assert [names[i] for i in np.flatnonzero(sensitive)] == ["demo_ethnicity", "demo_sex",
                                                            "demo_age"]
  assert np.all(np.bincount(y) > 600)
  # labels depend on several groups: each group alone predicts well above the
  # majority class
  from sklearn.linear_model import LogisticRegression
  majority = np.bincount(y[2000:]).max() / 1000
  for lo, hi in [(0, 305), (305, 483), (525, 847)]:
    xs = (x[:, lo:hi] - x[:2000, lo:hi].mean(0)) / (x[:2000, lo:hi].std(0) + 1e-9)
    model = LogisticRegression(C=0.05, max_iter=500).fit(xs[:2000], y[:2000])
    assert model.score(xs[2000:], y[2000:]) > majority + 0.05, lo
  np.testing.assert_array_equal(tabular.healthcare_data(50, seed=1)[0],
                                tabular.healthcare_data(50, seed=1)[0])


def test_the_severity_generator_keeps_the_groups_and_its_signal_runs_through_them():
  x, y, tiers, names, sensitive = tabular.healthcare_data(3000, seed=1, generator="severity")
  ref = tabular.healthcare_data(50, seed=1)
  assert x.shape == (3000, 847) and names == ref[3]
  np.testing.assert_array_equal(tiers, ref[2])
  np.testing.assert_array_equal(sensitive, ref[4])
  assert set(np.unique(x[:, :305])) <= {0.0, 1.0, 2.0}
  assert x[:, 305:483].min() >= 0 and x[:, 305:483].max() <= 40
  assert np.all(x[:, 525:] > 0)
  assert np.bincount(y).tolist() == [1200, 900, 900]          # thresholds at 40 % and 70 %
  # the stages are ordered: clinical scores rise and imaging volumes shrink with them
  clin, img = x[:, 305:483].mean(1), np.log(x[:, 525:]).mean(1)
  assert np.all(np.diff([clin[y == k].mean() for k in range(3)]) > 0)
  assert np.all(np.diff([img[y == k].mean() for k in range(3)]) < 0)
  from sklearn.linear_model import LogisticRegression
  majority = np.bincount(y[2000:]).max() / 1000
  for lo, hi in [(0, 305), (305, 483), (525, 847)]:   # causes (genotype) and markers
    xs = (x[:, lo:hi] - x[:2000, lo:hi].mean(0)) / (x[:2000, lo:hi].std(0) + 1e-9)
    model = LogisticRegression(C=0.05, max_iter=500).fit(xs[:2000], y[:2000])
    assert model.score(xs[2000:], y[2000:]) > majority + 0.05, lo
  with pytest.raises(DataError, match="generator 'nope'; allowed: logits, severity"):
    tabular.healthcare_data(10, generator="nope")


def test_an_mlp_learns_the_severity_cohort_centrally():
  """Issue 23's bar: a 256-128-64 MLP (scikit-learn's, an implementation apart
  from ours) reaches >= 95 % on held-out patients (96.4 % here; the logits
  generator's logistic regression reaches 83 % at 5,000)."""
  import warnings
  from sklearn.neural_network import MLPClassifier
  x, y, *_ = tabular.healthcare_data(8000, seed=0, generator="severity")
  mean, sd = x[:6400].mean(0), x[:6400].std(0) + 1e-9
  xs = (x - mean) / sd
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")    # 60 epochs: a ConvergenceWarning, and 96 %
    model = MLPClassifier((256, 128, 64), max_iter=60, random_state=0).fit(xs[:6400], y[:6400])
  assert model.score(xs[6400:], y[6400:]) >= 0.955


def test_federated_training_feels_label_skew_on_the_severity_cohort(tmp_path):
  """The same FedAvg protocol, IID against Dirichlet 0.01 (each client nearly one
  stage): IID reaches 94.5 %, the skewed clients 89.7 %."""
  import fedjax_dp
  acc = {}
  for part in ("iid", "dirichlet_client"):
    cfg = dict(dataset="healthcare", healthcare_examples=3000, healthcare_generator="severity",
               num_clients=30, clients_per_round=10, partition=part, hidden=[64],
               local_epochs=2, batch_size=32, lr=0.05, rounds=40, eval_every=40)
    if part != "iid":
      cfg["alpha"] = 0.01
    summary = fedjax_dp.run(cfg, out=str(tmp_path / part), progress=False, log=lambda m: None)
    acc[part] = summary["final"]["test_accuracy"]
  assert acc["iid"] >= 0.92
  assert acc["dirichlet_client"] <= acc["iid"] - 0.015


def test_loaders_carry_tiers():
  ds = load_dataset("healthcare", seed=0, num_examples=500)
  assert ds.x_train.shape == (400, 847) and ds.num_classes == 3
  assert ds.feature_tiers.shape == (847,) and ds.sensitive.sum() == 3
  bc = load_dataset("breast_cancer")
  assert bc.x_train.shape[1] == 30 and bc.num_classes == 2 and bc.feature_tiers is None
  assert len(bc.feature_names) == 30


def write_csv(path, header, rows):
  path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")


def test_csv_with_a_tier_map(tmp_path):
  data = tmp_path / "d.csv"
  write_csv(data, ["age", "snp", "site", "label"], [[60 + i, i % 3, i % 2, i % 2] for i in range(20)])
  tmap = tmp_path / "tiers.csv"
  tmap.write_text("feature,tier\nage,medium\nsnp,HIGH\nsite,metadata\n")
  ds = load_dataset("csv", path=str(data), tier_map=str(tmap))
  assert ds.feature_names == ("age", "snp", "site")
  np.testing.assert_array_equal(ds.feature_tiers, [tabular.MEDIUM, tabular.HIGH, tabular.METADATA])
  jmap = tmp_path / "tiers.json"
  jmap.write_text(json.dumps({"age": "low", "snp": "high", "site": "public"}))
  ds = load_dataset("csv", path=str(data), tier_map=str(jmap))
  np.testing.assert_array_equal(ds.feature_tiers, [tabular.LOW, tabular.HIGH, tabular.PUBLIC])


@pytest.mark.parametrize("text,name,message", [
    ("age,medium\nsnp,high\n", "t.csv", "feature 'site' has no tier"),
    ("age,medium\nsnp,high\nsite,secret\n", "t.csv", "tier 'secret'; allowed are high"),
    ("age,medium\nsnp,high\nsite,low\nweight,low\n", "t.csv", "'weight' is not a column"),
    ("age,medium,x\n", "t.csv", "row 1 has 3 fields"),
    ("{not json", "t.json", "not valid JSON"),
])
def test_bad_tier_maps_are_one_line_errors(tmp_path, text, name, message):
  data = tmp_path / "d.csv"
  write_csv(data, ["age", "snp", "site", "label"], [[1, 2, 3, 0], [2, 1, 0, 1]])
  tmap = tmp_path / name
  tmap.write_text(text)
  with pytest.raises(DataError, match=message) as e:
    load_dataset("csv", path=str(data), tier_map=str(tmap))
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match="no such tier map"):
    load_dataset("csv", path=str(data), tier_map=str(tmp_path / "missing.csv"))


def test_breast_cancer_takes_a_tier_map_by_its_feature_names(tmp_path):
  import os
  shipped = os.path.join(os.path.dirname(__file__), "..", "experiments", "breast_cancer_tiers.csv")
  bc = load_dataset("breast_cancer", tier_map=shipped)
  want = [tabular.HIGH if n.startswith("worst ") else tabular.LOW if n.endswith(" error")
          else tabular.MEDIUM for n in bc.feature_names]
  np.testing.assert_array_equal(bc.feature_tiers, want)
  assert sorted(np.bincount(bc.feature_tiers)[[tabular.HIGH, tabular.MEDIUM, tabular.LOW]]) == \
      [10, 10, 10]
  bad = tmp_path / "t.csv"
  bad.write_text("mean radius,high\n")
  with pytest.raises(DataError, match="feature 'mean texture' has no tier") as e:
    load_dataset("breast_cancer", tier_map=str(bad))
  assert "\n" not in str(e.value)


def test_tier_map_path_is_read_with_csv_and_breast_cancer_only():
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  make_config({"dataset": "breast_cancer", "tier_map_path": "t.csv"})
  with pytest.raises(ConfigError, match="read with dataset 'csv' or 'breast_cancer'"):
    make_config({"dataset": "digits", "tier_map_path": "t.csv"})
