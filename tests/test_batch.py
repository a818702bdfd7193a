"""Many runs into one tree (experiment/batch.py, the experiment scripts): the whole
request checked before the first run; a tree belongs to one experiment and dataset;
the scripts' default --out is outside the repository, one folder per dataset."""

import json
import os

import pytest

from fedjax_dp import make_config
from fedjax_dp.experiment import batch
from fedjax_dp.errors import RunError

ROOT = os.path.join(os.path.dirname(__file__), "..")
CFG = dict(dataset="digits", num_clients=6, clients_per_round=3, hidden=(8,), rounds=2,
           eval_every=2, devices=1)


def test_a_tree_belongs_to_one_experiment_and_dataset(tmp_path):
  root = str(tmp_path / "t")
  batch.claim_tree(root, {"experiment": "topksdp", "dataset": "fmnist"})
  batch.claim_tree(root, {"experiment": "topksdp", "dataset": "fmnist"})   # the same: fine
  with open(os.path.join(root, "experiment.json")) as f:
    assert json.load(f) == {"experiment": "topksdp", "dataset": "fmnist"}
  with pytest.raises(RunError, match=r"holds another experiment's results \(dataset 'fmnist' "
                                     r"there, 'mnist' asked\)"):
    batch.claim_tree(root, {"experiment": "topksdp", "dataset": "mnist"})
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("mine")
  with pytest.raises(RunError, match="is not empty and holds no experiment.json"):
    batch.claim_tree(str(tmp_path / "other"), {"experiment": "topksdp", "dataset": "fmnist"})
  assert os.listdir(tmp_path / "other") == ["notes.txt"]


def test_a_conflict_at_the_last_run_is_found_before_the_first(tmp_path):
  from fedjax_dp.experiment.runner import run_experiment
  cells = [(str(tmp_path / f"cell{i}"), make_config(dict(CFG, seed=i))) for i in range(3)]
  run_experiment(make_config(dict(CFG, seed=2, rounds=4, eval_every=4)), cells[2][0],
                 progress=False, log=lambda m: None)   # the last cell: other rounds
  with pytest.raises(RunError, match=r"cell2 holds a run with other settings \(rounds 4 there, "
                                     r"2 asked; .*found before any run: nothing was run"):
    batch.check_request(cells, overwrite=False)
  assert not os.path.exists(cells[0][0])
  batch.check_request(cells, overwrite=True)   # --overwrite reruns it: no conflict


def test_missing_data_is_found_before_the_first_run(monkeypatch):
  from fedjax_dp.data import registry
  monkeypatch.setattr(registry, "find_dataset",
                      lambda name, data_dir=None: (name != "mnist", "put the IDX files in DIR"))
  cells = [("/nonexistent/a", make_config(dict(CFG))),
           ("/nonexistent/b", make_config(dict(CFG, dataset="mnist", hidden=(8,))))]
  with pytest.raises(RunError, match="dataset 'mnist' is not available: put the IDX files in "
                                     "DIR .found before any run"):
    batch.check_request(cells, overwrite=False)


def _script(name):
  from tests.helpers import experiment_script
  return experiment_script(name)


def test_the_scripts_write_outside_the_repository_one_tree_per_dataset(tmp_path, monkeypatch,
                                                                        capsys):
  """--dataset mnist (no data here) goes to runs/topksdp/mnist, refused before any run;
  the Fashion-MNIST tree is untouched."""
  from fedjax_dp.data import registry
  monkeypatch.setattr(registry, "find_dataset",
                      lambda name, data_dir=None: (False, "no MNIST here"))
  monkeypatch.chdir(tmp_path)
  run = _script("topksdp")
  assert run.main(["table2", "--dataset", "mnist", "--algorithms", "fedavg", "--seeds", "0",
                   "--rounds", "2"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: dataset 'mnist' is not available: no MNIST here"), err
  assert os.listdir(tmp_path / "runs" / "topksdp") == ["mnist"]
  assert os.listdir(tmp_path / "runs" / "topksdp" / "mnist") == ["experiment.json"]
  assert _script("dynamic_dp").build_parser().parse_args(["table4"]).out == \
      os.path.join("runs", "dynamic_dp")
