"""Every kind of the three paper scripts, on its first cell, through the script's main.

CI (`make test-slow`) ran only one kind of each script end to end: topksdp table2
(tests/test_experiments.py), dynamic_dp table4 and adversarial table5. The other
kinds' cell generators, config settings, row functions and table / plot writers
ran only in `make test-long` (the README's commands, over an hour), so a bug in
one of them reached no CI run. Here each kind runs through the script's own
`main` (argument checks, claim_tree, the cell generator, config building and
check_request, run-or-reuse, the row function, the kind's writers) in this
process, with its cell generator cut to its first cell, at 1 round on the
smallest data the script takes (stand-in IDX files; the synthetic healthcare
cohort), and its tables are read back. Two departures, each said where it is
made: dynamic_dp's budget kind runs 4 rounds, not 2,000 (_spent_in_two_rounds),
and the adversarial fmnist protocol reads stand-in files (fmnist_stand_in). The
other cells' configs are built without a run (the last test).
"""

import argparse
import csv
import itertools
import math

import pytest

from tests.helpers import experiment_script


def _first(cells):
  """A cell generator cut to its first cell: the kind's code paths on one run."""
  return lambda *args: itertools.islice(cells(*args), 1)


def _main(run, argv, capsys):
  """run.main(argv) in this process; its one-line error shown if it fails."""
  status = run.main(argv)
  assert status == 0, capsys.readouterr().err[-2000:]


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def _finite(text):
  return text not in ("", "None") and math.isfinite(float(text))


def _accuracy(text):
  return _finite(text) and 0 <= float(text) <= 1


# ----------------------------------------------------------------------- topksdp

@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
  """Stand-in MNIST IDX files (tests/test_data.py), the size test_experiments.py's
  --data-dir test uses: every one of the 100 clients gets examples."""
  from tests.test_data import write_mnist_folder
  folder = tmp_path_factory.mktemp("mnist")
  write_mnist_folder(folder, n_train=1200, n_test=100, gz=True)
  return str(folder)


# each kind's check of its one row and its markdown (the first cell's settings)
TOPKSDP_CHECKS = {
    "table2": lambda row, md: (row["algorithm"] == "topksdp" and _finite(row["bytes_up"])
                               and "| medium (0.5) | topksdp |" in md and "96.61" in md),
    "sparsity": lambda row, md: (float(row["s_global"]) == 0.0
                                 and float(row["mb_per_round_trip"]) > 0
                                 and float(row["dense_mb_per_round_trip"]) > 0
                                 and "| 0 | " in md and "93 %" in md),
    # the paper's chain is its formula's epsilon; the accountant gives none with top-k
    "privacy": lambda row, md: (float(row["ldp_epsilon"]) == 1.0
                                and _finite(row["papers_chain_epsilon"])
                                and row["accountant_epsilon"] == ""
                                and "| 1 | 0.5 |" in md
                                and "none (not a complete guarantee)" in md),
    "mu": lambda row, md: (row["form"] == "bounded" and row["diverged"] in ("True", "False")
                           and "Best cell (bounded)" in md),
    "fedadmm": lambda row, md: (row["admm_upload"] == "augmented"
                                and _accuracy(row["last_quarter_min"])
                                and "| augmented | 0.001 | 0.25 |" in md),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(TOPKSDP_CHECKS))
def test_topksdp_kind_on_its_first_cell(kind, mnist_dir, tmp_path, capsys):
  run = experiment_script("topksdp")
  assert set(run.KINDS) == set(TOPKSDP_CHECKS)   # a new kind gets a check here
  cells_of, row_of = run.KINDS[kind]
  run.KINDS[kind] = (_first(cells_of), row_of)
  out = tmp_path / "out"
  # table2's writer averages every algorithm asked for: ask for the first cell's alone
  only = ["--algorithms", run.ALGORITHMS[0]] if kind == "table2" else []
  _main(run, [kind, "--dataset", "mnist", "--data-dir", mnist_dir, "--rounds", "1",
              "--seeds", "0", "--out", str(out), *only], capsys)
  rows = _rows(out / f"{kind}.csv")
  assert len(rows) == 1 and _accuracy(rows[0]["final_accuracy"])
  md = (out / f"{kind}.md").read_text()
  assert TOPKSDP_CHECKS[kind](rows[0], md), (rows[0], md)
  assert (out / ("table2_medium.png" if kind == "table2" else f"{kind}.png")).exists()


# -------------------------------------------------------------------- dynamic_dp

# each kind's first cell: its label in the table, and the check of its row and markdown
DYNAMIC_CHECKS = {
    "table4": ("no_privacy", lambda row, md: (row["epsilon_accountant"] == ""
                                              and "98.2 / inf / 450" in md)),
    # the full method: the analyzer's tiers and the accountant's epsilon within 1.9
    "ablations": ("full", lambda row, md: (0 < float(row["epsilon_accountant"]) <= 1.9
                                           and _finite(row["tier_accuracy"])
                                           and "| 96.1 |" in md)),
    "alpha": ("no_privacy", lambda row, md: (float(row["alpha"]) == 1.0
                                             and "| 1.0 | no_privacy |" in md)),
    "budget": ("static_dp", lambda row, md: _budget_spent_in_two(row, md)),
}


def _budget_spent_in_two(row, md):
  """The budget row of _spent_in_two_rounds's cell: 2 of its 4 rounds ran (rounds
  past the budget of 2.0 are skipped), and epsilon per round is over those 2."""
  eps = float(row["epsilon_accountant"])
  return (0 < eps <= 2.0 and row["rounds"] == "2"
          and float(row["epsilon_per_round"]) == pytest.approx(eps / 2)
          and "| static_dp | 2 |" in md and "800 / 0.0025" in md)


def _spent_in_two_rounds(run, cells):
  """The budget kind's cells with its budget spent within 4 rounds, not 2,000.

  budget() runs every cell for at least 2,000 rounds at the noise that spends its
  budget (2.0) in 800 (six minutes here); the same cell with 4 rounds at the noise
  that spends it in 2 takes the same path, rounds past the budget skipped included."""
  from fedjax_dp.recipes.privacy import noise_multiplier_for

  def shrunk(args):
    z = noise_multiplier_for(run.load_protocol({**run.PROTOCOLS[args.protocol], "dp": "central",
                                                "target_epsilon": 2.0, "rounds": 2}))
    for name, sets, label, extra in cells(args):
      yield name, dict(sets, noise_multiplier=z, rounds=4), label, extra
  return shrunk


# the protocols other than the paper's select other data, not other script code:
# large, ten times the records and clients (table4's first cell: no DP, the cheapest
# at that size); paper_severity, another generator, under the analyzer's full method
# (ablations' first cell), whose tiers are read from that data
PROTOCOL_CASES = [("table4", "large"), ("ablations", "paper_severity")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,protocol",
                         [(k, "paper") for k in DYNAMIC_CHECKS] + PROTOCOL_CASES)
def test_dynamic_dp_kind_on_its_first_cell(kind, protocol, tmp_path, capsys):
  run = experiment_script("dynamic_dp")
  assert set(run.KINDS) == set(DYNAMIC_CHECKS)
  assert {p for _, p in PROTOCOL_CASES} == set(run.PROTOCOLS) - {"paper"}
  run.KINDS[kind] = _first(run.KINDS[kind])
  if kind == "budget":
    run.KINDS[kind] = _spent_in_two_rounds(run, run.KINDS[kind])
  # --analyzer-steps: the analyzer's networks trained briefly (as test_experiments.py)
  _main(run, [kind, "--protocol", protocol, "--rounds", "1", "--seeds", "0",
              "--analyzer-steps", "20", "--out", str(tmp_path)], capsys)
  root = tmp_path / protocol
  rows = _rows(root / f"{kind}.csv")
  label, check = DYNAMIC_CHECKS[kind]
  assert len(rows) == 1 and rows[0]["run"] == label and _accuracy(rows[0]["final_accuracy"])
  md = (root / f"{kind}.md").read_text()
  assert f"protocol {protocol}" in md and check(rows[0], md), (rows[0], md)
  assert (root / f"{kind}.png").exists()


# ------------------------------------------------------------------- adversarial

@pytest.fixture(scope="module")
def fmnist_stand_in(tmp_path_factory):
  """Stand-in Fashion-MNIST IDX files for the fmnist protocol (fmnist.yaml: 3,000
  clients of 20 examples, so the full 60,000 training images; random, plain IDX):
  the script takes no --data-dir, and $FEDJAX_DP_DATA is searched before the
  Debian package, so the test runs the same with or without it."""
  from tests.test_data import write_mnist_folder
  folder = tmp_path_factory.mktemp("fmnist")
  write_mnist_folder(folder, n_train=60000, n_test=1000, gz=False)
  return str(folder)


def _first_variant(variants):
  """The adversarial script's cell generator, run.variants, cut to its first
  variant (the clean, undefended run of the arm), on --seeds 0 alone. The refused
  combinations stay: the dp table lists them, and nothing runs them."""
  def first(*args):
    found, refused = variants(*args)
    return found[:1], refused
  return first


ADVERSARIAL_CASES = [("robustness", "fmnist"), ("dp", "healthcare"),
                     ("inference", "healthcare"), ("table5", "fmnist")]


def _adversarial_checks(kind, dataset, root):
  """The kind's tables: the clean row with a finite accuracy (and its epsilon under DP)."""
  tabular = dataset == "healthcare"   # attribute inference: on tabular data only
  if kind == "table5":
    for arm in ("robustness", "dp", "inference"):
      _adversarial_checks(arm, dataset, root)
    md = (root / "table5.md").read_text()
    assert "-1.2% / Yes" in md and "| Inference | Membership |" in md
    assert ("n/a (images: no tabular attribute)" in md) != tabular
    return
  rows = _rows(root / f"{kind}.csv")
  if kind == "inference":
    assert len(rows) == 1 and rows[0]["dp"] == "none" and _accuracy(rows[0]["test_accuracy"])
    assert _accuracy(rows[0]["mia_accuracy"]) and _accuracy(rows[0]["shadow_accuracy"])
    md = (root / "inference.md").read_text()
    assert "| none |" in md and ("Attribute inference of" in md) == tabular
    return
  clean = [r for r in rows if r["refused"] in ("", None)] if "refused" in rows[0] else rows
  assert len(clean) == 1 and clean[0]["attack"] == "none" and clean[0]["defense"] == "mean"
  assert _accuracy(clean[0]["test_accuracy_mean"])
  md = (root / f"{kind}.md").read_text()
  assert "| none | 0 |" in md and (root / f"{kind}.png").exists()
  if kind == "dp":
    assert 0 < float(clean[0]["epsilon_mean"]) <= 1.9
    assert "Refused under central DP" in md and "Accounted epsilon at the end" in md


@pytest.mark.slow
# a one-cell table has no attack to draw a panel for: its figure is empty, legend too
@pytest.mark.filterwarnings("ignore:No artists with labels found")
@pytest.mark.parametrize("kind,dataset", ADVERSARIAL_CASES)
def test_adversarial_kind_on_its_first_cell(kind, dataset, tmp_path, capsys, request,
                                            monkeypatch):
  run = experiment_script("adversarial")
  assert {k for k, _ in ADVERSARIAL_CASES} == set(run.KINDS)
  assert {d for _, d in ADVERSARIAL_CASES} == set(run.PROTOCOLS)
  if dataset == "fmnist":
    monkeypatch.setenv("FEDJAX_DP_DATA", request.getfixturevalue("fmnist_stand_in"))
  run.variants = _first_variant(run.variants)
  _main(run, [kind, "--dataset", dataset, "--rounds", "1", "--seeds", "0",
              "--out", str(tmp_path)], capsys)
  _adversarial_checks(kind, dataset, tmp_path / dataset)


# ---------------------------------------------------------- every cell's config

@pytest.mark.slow   # ~3 s, beside the runs above
def test_every_cell_of_every_kind_builds_its_config():
  """The runs above take each kind's first cell; its other cells' settings are
  checked here without a run: each builds its config (the library refuses a bad
  key or combination) on every dataset and protocol the scripts take.
  (tests/test_adversarial_experiment.py does this for the adversarial script.)"""
  topksdp = experiment_script("topksdp")
  for dataset in ("fmnist", "mnist", "cifar10"):
    args = argparse.Namespace(
        dataset=dataset, data_dir="unused", rounds=1, seeds=[0], levels=list(topksdp.LEVELS),
        algorithms=topksdp.ALGORITHMS, forms=["bounded", "moon_params"],
        mu_grid=[0.001, 0.005, 0.01])
    for kind, (cells_of, _) in topksdp.KINDS.items():
      for name, sets, _ in cells_of(args):
        assert topksdp.cell_config(sets, args).dataset == dataset, name
  dynamic = experiment_script("dynamic_dp")
  for protocol in dynamic.PROTOCOLS:
    args = dynamic.build_parser().parse_args(["table4", "--protocol", protocol, "--rounds", "1"])
    for kind, cells_of in dynamic.KINDS.items():
      for name, sets, _, _ in cells_of(args):
        assert dynamic.cell_config(args, sets).rounds >= 1, (protocol, name)
