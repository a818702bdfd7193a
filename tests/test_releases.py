"""What a run publishes, and what it says about it (issue 39: findings 4 and 5; the
release registry).
"""

import itertools
import json

import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment.setup import setup
from tests.helpers import covering_array, grid_runs, make_test_runs, pairs_and

DIGITS = dict(dataset="digits", num_clients=20, clients_per_round=5, hidden=[16], local_epochs=1,
              batch_size=16, lr=0.05, rounds=3, eval_every=1)


def _rows(out):
  return [json.loads(line) for line in open(out / "metrics.jsonl")]


def test_poisson_central_dp_publishes_unclipped_over_the_expected_cohort(tmp_path):
  """Finding 4: unclipped_fraction was unclipped / realised participants (0.462 =
  6/13, 0.111 = 1/9), which gives away the realised Poisson cohort sizes that the
  report says are published as expected values only."""
  values = dict(DIGITS, dp="central", noise_multiplier=1.0, clip_norm=0.3, sampling="poisson")
  fedjax_dp.run(values, out=str(tmp_path / "run"), progress=False, log=lambda m: None)
  rows = _rows(tmp_path / "run")
  _, _, sim = setup(make_config(values), None)     # the same release: the same key and rounds
  state, stats = sim.run_rounds(sim.init_state(), 3)
  unclipped, participants = np.asarray(stats.unclipped), np.asarray(stats.participants)
  assert len(set(participants.tolist())) > 1 or participants[0] != 5   # realised != expected
  for row, u in zip(rows, unclipped):
    assert row["unclipped_fraction"] == pytest.approx(u / 5)
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert "unclipped_fraction is over that expected cohort" in summary["privacy"][
      "published_cohort_sizes"]


def test_noise_seed_secret_names_the_run_key_file(tmp_path):
  """Finding 5: the report's `assumes` named only the checkpoints as holding the key;
  run_key.secret stays in the run folder, also with checkpoint_every 0."""
  values = dict(DIGITS, dp="central", noise_multiplier=1.0, noise_seed="secret",
                checkpoint_every=0, rounds=1)
  fedjax_dp.run(values, out=str(tmp_path / "run"), progress=False, log=lambda m: None)
  assert (tmp_path / "run" / "run_key.secret").exists()
  assumes = json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]["assumes"]
  assert any("run_key.secret" in line for line in assumes)
  assert any("every run draws its own keys" in line for line in assumes)


# ------------------------------------------------------------------ the release registry

from fedjax_dp.experiment import releases  # noqa: E402


def test_the_registry_declares_each_kind_of_name_and_refuses_others():
  central = make_config(dict(DIGITS, dp="central", noise_multiplier=1.0))
  local = make_config(dict(DIGITS, dp="local", noise_multiplier=1.0))
  d = releases.declaration
  assert d("metrics.jsonl:train_loss", central).status == releases.NOT_COVERED
  assert d("metrics.jsonl:test_accuracy", central).status == releases.COVERED
  assert d("summary.json:final.test_loss", central).status == releases.COVERED
  assert d("loss.png", central).status == releases.NOT_COVERED   # it plots train_loss
  assert d("accuracy.png", central).status == releases.COVERED
  # a robust rule's or the norm bound's count: post-processing of noised reports under
  # local DP, an unnoised count of the updates under central DP (finding 4)
  assert d("metrics.jsonl:norm_bounded", central).status == releases.NOT_COVERED
  assert d("metrics.jsonl:norm_bounded", local).status == releases.COVERED
  assert d("summary.json:privacy.kept_noise.size_leak.n", central).status == releases.NOT_COVERED
  assert d("sweep:final.csv:train_loss_mean", central).status == releases.NOT_COVERED
  assert d("sweep:results.csv:lr", central).status == releases.PUBLIC
  for bogus in ("metrics.jsonl:bogus", "summary.json:bogus", "notes.txt", "sweep:x.bin"):
    assert d(bogus, central) is None, bogus


def _check_run_folder(out, cfg):
  """Every name the run folder holds is declared, and its report's not_accounted is
  the registry's for exactly those names (the summary declared its plots before
  drawing them)."""
  summary = json.loads((out / "summary.json").read_text())
  names = releases.run_outputs(str(out), _rows(out), summary)
  assert releases.undeclared(names, cfg) == []
  privacy = summary["privacy"]
  if cfg.dp == "none" and cfg.kept_noise == "none":
    assert "not_accounted" not in privacy
    return names
  facts = {"pooled_scaling": False, "cohort_overflow": summary["cohort_overflow"]}
  assert privacy["not_accounted"] == releases.not_accounted(cfg, names, facts)
  listed = " ".join(privacy["not_accounted"])
  for name in names:
    shown = name.partition(":")[2] or name
    if releases.declaration(name, cfg).status == releases.NOT_COVERED:
      assert shown.split(".")[-1] in listed, name
  return names


RUNS = {
    # finding 4's setting: the norm bound's count under Poisson central DP, attackers too
    "central_poisson_bound_attack": dict(dp="central", noise_multiplier=1.0, sampling="poisson",
                                         server_clip_l2=0.3, byzantine_fraction=0.1,
                                         byzantine_attack="scaled", byzantine_scale=3.0),
    "local_median_budgets": dict(dp="local", noise_multiplier=2.0, aggregator="median",
                                 target_epsilon=50.0),
    "kept_noise_paper": dict(s_local=0.5, final_clip_l2=0.1, kept_noise="paper",
                             ldp_epsilon=5.0),
    "dp_none": dict(),
    "central_adaptive_secret_checkpoints": dict(dp="central", noise_multiplier=1.0,
                                                adaptive_clipping=True, noise_seed="secret",
                                                checkpoint_every=1),
    "local_allocated_cluster": dict(dataset="breast_cancer", dp="local", noise_multiplier=2.0,
                                    target_epsilon=20.0, client_budgets="allocated",
                                    aggregator="cluster", cluster_noise="equalize"),
}


@pytest.mark.parametrize("name", make_test_runs(list(RUNS), keep={
    "central_poisson_bound_attack", "kept_noise_paper"}))
def test_every_output_of_a_run_is_declared_and_the_uncovered_ones_are_listed(tmp_path, name):
  values = dict(DIGITS, rounds=2, **RUNS[name])
  log = ("csv", "tensorboard") if name == "local_median_budgets" else ()
  from fedjax_dp.experiment.writers import writers_for
  from fedjax_dp import callbacks as callbacks_lib
  callbacks = [callbacks_lib.log_metrics(*writers_for(log, str(tmp_path / "run")))] if log else []
  fedjax_dp.run(values, out=str(tmp_path / "run"), progress=False, log=lambda m: None,
                callbacks=callbacks)
  names = _check_run_folder(tmp_path / "run", make_config(values))
  if name == "central_poisson_bound_attack":
    assert "metrics.jsonl:norm_bounded" in names
  if log:
    assert "metrics.csv:train_loss" in names and "tensorboard/" in names


# The generated grid (issue 39, item 3): mechanism x attack x defense x adaptive clipping
# x how the run is made (the CLI's path, your own data through the API, a sweep's vmapped
# replicas, a resume with more rounds); combinations the config refuses are skipped.
GRID_AXES = {
    "mechanism": {"none": {}, "central": dict(dp="central", noise_multiplier=1.0),
                  "local": dict(dp="local", noise_multiplier=2.0),
                  "kept": dict(s_local=0.5, final_clip_l2=0.1, kept_noise="multiplier",
                               kept_noise_multiplier=2.0)},
    "attack": {"none": {}, "scaled": dict(byzantine_fraction=0.1, byzantine_attack="scaled",
                                          byzantine_scale=3.0)},
    "defense": {"none": {}, "norm_bound": dict(server_clip_l2=0.3),
                "median": dict(aggregator="median")},
    "adaptive": {"static": {}, "adaptive": dict(adaptive_clipping=True)},
    "made": {"run": {}, "own_data": {}, "sweep": {}, "resume": {}},
}


def _grid() -> list[tuple]:
  out = []
  for combo in itertools.product(*(list(v) for v in GRID_AXES.values())):
    values = dict(DIGITS, rounds=2)
    for axis, choice in zip(GRID_AXES, combo):
      values.update(GRID_AXES[axis][choice])
    try:
      make_config(values)
    except ConfigError:
      continue
    out.append("-".join(combo))
  return out


GRID = _grid()
GRID_FAST = {"central-scaled-norm_bound-static-sweep"}
# CI's runs: every pair of settings together, every mechanism x attack x defense and
# every mechanism x clipping x how the run is made (26 of 104; make test-long: all)
GRID_CI = {"-".join(c) for c in covering_array(
    [tuple(g.split("-")) for g in GRID], pairs_and(5, (0, 1, 2), (0, 3, 4)))}


def _blobs_data():
  """Your own data: 20 clients' blobs, a test set of rows no client holds."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(260, 64)).astype(np.float32)
  y = (x[:, :3].argmax(1)).astype(np.int32)
  return fedjax_dp.data.from_arrays(x[:200], y[:200], client_ids=np.arange(200) % 20,
                                    test=(x[200:], y[200:]))


@pytest.mark.parametrize("combo", grid_runs(GRID, keep=GRID_FAST, ci=GRID_CI))
def test_grid_of_runs_publishes_only_declared_outputs(tmp_path, combo):
  combo = combo.split("-")
  values = dict(DIGITS, rounds=2)
  for axis, choice in zip(GRID_AXES, combo):
    values.update(GRID_AXES[axis][choice])
  made = combo[-1]
  quiet = dict(progress=False, log=lambda m: None)
  if made == "sweep":
    spec = {"config": values, "grid": {"lr": [0.05, 0.1]}, "replica_batch": 2}
    record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), **quiet)
    assert releases.undeclared(releases.sweep_outputs(str(tmp_path / "s"), record),
                               make_config(values)) == []
    folders = sorted((tmp_path / "s" / "cells").iterdir())
  elif made == "own_data":
    values.update(dataset="custom", num_clients=20)
    fedjax_dp.run(values, out=str(tmp_path / "run"), data=_blobs_data(), **quiet)
    folders = [tmp_path / "run"]
  else:
    fedjax_dp.run(dict(values, checkpoint_every=1 if made == "resume" else 0),
                  out=str(tmp_path / "run"), **quiet)
    if made == "resume":
      fedjax_dp.run(dict(values, checkpoint_every=1, rounds=3), out=str(tmp_path / "run"),
                    resume=True, **quiet)
    folders = [tmp_path / "run"]
  for folder in folders:
    cfg = make_config(json.loads((folder / "config.json").read_text()), refuse_unread=False)
    names = _check_run_folder(folder, cfg)
    if made == "own_data":
      assert "inputs.json" in names


def test_the_docs_table_is_the_registrys():
  import os
  page = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "explanation",
                           "guarantee.md")).read()
  block = page.split("<!-- releases:start -->\n")[1].split("<!-- releases:end -->")[0]
  assert block == releases.markdown(), ("the docs' table differs from the registry: paste "
                                        "fedjax_dp.experiment.releases.markdown() between the "
                                        "releases markers")


@pytest.mark.slow
def test_every_output_of_a_sweep_audit_attack_compare_and_profile_is_declared(tmp_path):
  """The other commands' outputs: a vmapped sweep over noise and lr (each cell's folder
  as a run's, the sweep's own files and its privacy section), a one-shot and a
  multi-run audit, the attacks' reports, compare's table, a profile."""
  from fedjax_dp.experiment.compare import compare_rows, load_runs
  from fedjax_dp.experiment import reporting
  base = dict(DIGITS, rounds=2, dp="central", noise_multiplier=1.0)
  spec = {"config": base, "grid": {"noise_multiplier": [1.0, 2.0], "lr": [0.05, 0.1]},
          "replica_batch": 2}
  record = fedjax_dp.sweep(spec, out=str(tmp_path / "s"), progress=False, log=lambda m: None)
  cfg = make_config(base)
  names = releases.sweep_outputs(str(tmp_path / "s"), record)
  assert releases.undeclared(names, cfg) == []
  assert record["privacy"]["releases"] == 4 and "composes" in record["privacy"]["composition"]
  assert any("train_loss" in line for line in record["privacy"]["not_accounted"])
  for cell in (tmp_path / "s" / "cells").iterdir():
    _check_run_folder(cell, make_config(json.loads((cell / "config.json").read_text())))
  # the one-shot audit writes audit.json into its run folder
  audit = dict(base, num_clients=20, clients_per_round=20, rounds=2)
  fedjax_dp.audit(audit, out=str(tmp_path / "a"), canaries=10, bootstrap=50, log=lambda m: None,
                  progress=False)
  names = releases.run_outputs(str(tmp_path / "a"), _rows(tmp_path / "a"))
  assert "audit.json" in names and releases.undeclared(names, cfg) == []
  got = fedjax_dp.audit_runs(dict(audit, rounds=1), out=str(tmp_path / "m"), runs=20,
                             bootstrap=50, log=lambda m: None, progress=False)
  names = [f"audit:{n}" for n in releases.run_outputs(str(tmp_path / "m"), [])]
  names += [f"audit:audit.json:{k}" for k in releases.flatten(got)]
  assert releases.undeclared(names, cfg) == []
  report = fedjax_dp.attack_mia(str(tmp_path / "a"))
  assert releases.declaration("attack:mia.json", cfg).status == releases.NOT_COVERED
  assert report["members"] > 0
  rows = compare_rows(load_runs([str(tmp_path / "s"), str(tmp_path / "a")]))
  names = [f"compare:table.csv:{c}" for c in reporting.csv_text(rows).splitlines()[0].split(",")]
  assert releases.undeclared(names, cfg) == []
  fedjax_dp.profile(dict(base), out=str(tmp_path / "p"), rounds=1)
  names = [f"profile:{n}" for n in releases.run_outputs(str(tmp_path / "p"), [])]
  assert releases.undeclared(names, cfg) == [], names


def test_a_rules_counts_are_covered_only_where_each_report_is_noised_before_it_leaves():
  """flagged, clusters and norm_bounded are computed by the server from the uploads:
  post-processing (covered) only where every client noises its report before it leaves;
  a mechanism whose clients keep their own ledgers while the server noises the sum
  privatizes no report (per-client accounting alone once made them covered)."""
  import dataclasses
  from fedjax_dp.config import Config
  from fedjax_dp.experiment import releases
  from fedjax_dp.privacy.mechanisms import get_mechanism, register_mechanism
  from tests.helpers import registries_restored
  with registries_restored():
    register_mechanism(get_mechanism("central")._replace(name="ledgered_central",
                                                         per_client_ledgers=True))
    for dp, status in (("local", "covered"), ("central", "not covered"),
                       ("ledgered_central", "not covered"), ("none", "not covered")):
      cfg = dataclasses.replace(Config(), dp=dp)
      for key in ("flagged", "clusters", "norm_bounded"):
        assert releases.figure(key, cfg).status == status, (dp, key)
