"""Per-client state in a host table (placement/paged_state.py), against the device table."""

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest

from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.placement.paged_state import FileRows, HostTable
from tests.helpers import keyed_state, make_test_runs, toy_problem, toy_simulation

SIZES = tuple(range(2, 26))   # 24 clients, 2 to 25 examples


def run(rounds_per_call, **overrides):
  """Params, every client's state rows and the loss of each round, in calls of
  rounds_per_call rounds (a store off the device pages each round of a call)."""
  x, y, parts = toy_problem(sizes=SIZES, features=5, seed=1)
  sim = toy_simulation(x, y, parts, devices=2, **overrides)
  # one key for every table's run: a bfloat16 table is another release (its own draws)
  state, losses, spent = keyed_state(sim), [], 0
  for n in rounds_per_call:
    state, stats = sim.run_rounds(state, n, same_draws=True)
    losses.append(np.asarray(stats.loss_sum))
    spent += int(np.sum(stats.spent))
  if "target_epsilon" in overrides:
    assert spent > 0   # admission refused clients, whose rows must stay as they were
  rows = state.client_state
  if isinstance(rows, HostTable):
    rows = rows.gather(np.arange(len(parts)))
  return sim, jax.tree.map(np.asarray, (state.params, rows, np.concatenate(losses)))


# SCAFFOLD's control variates (fixed cohorts, some clients drawn in consecutive rounds),
# TopkSDP-FL's residuals with Poisson cohorts of varying size, MOON's previous models
CASES = {
    "scaffold": dict(algorithm="scaffold", clients_per_round=7, momentum=0.0),
    "topksdp_poisson": dict(algorithm="topksdp", s_local=0.5, s_global=0.5,
                            sampling="poisson", clients_per_round=6, max_cohort=12),
    "moon": dict(algorithm="moon", clients_per_round=5),
    # local DP with a budget: admission refuses clients whose budget is spent, and
    # their rows must come back unchanged
    "topk_local_budget": dict(s_local=0.5, index_selection="random_k", clients_per_round=12, dp="local",
                              noise_multiplier=1.0, target_epsilon=12.0),
}


# `make test` runs SCAFFOLD (a row read and written per client); TopkSDP-FL's residuals,
# MOON's previous models and admission's refused rows run in `make test-slow` (CI runs both)
@pytest.mark.parametrize("case", make_test_runs(sorted(CASES), {"scaffold"}))
def test_host_and_disk_tables_reproduce_the_device_table_bit_for_bit(case, tmp_path):
  calls = (3, 1, 2)
  _, want = run(calls, **CASES[case])
  for store in ({"client_state_store": "host"},
                {"client_state_store": "disk", "client_state_dir": str(tmp_path)}):
    sim, got = run(calls, **CASES[case], **store)
    assert sim.paging is not None
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_array_equal(a, b)
    assert os.listdir(tmp_path) == []   # a disk table's files are unlinked once mapped


def test_bfloat16_table_halves_the_storage_and_rounds_only_the_stored_rows():
  case = CASES["scaffold"]
  _, want = run((4,), **case)
  sim, got = run((4,), **case, client_state_store="host", client_state_dtype="bfloat16")
  state = sim.init_state()
  assert all(t.dtype == ml_dtypes.bfloat16 for t in state.client_state.tables)
  d = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(state.params))
  assert state.client_state.nbytes == 2 * d * len(SIZES)
  # round 0 reads exact rows (zeros): same loss; later rounds read rounded control variates
  assert got[2][0] == want[2][0]
  for a, b in zip(jax.tree.leaves(want[0]), jax.tree.leaves(got[0])):
    np.testing.assert_allclose(a, b, atol=1e-3)
    assert not np.array_equal(a, b) or a.size < 4


def test_host_table_reads_round_zero_rows_until_written():
  """In host memory; the disk kind is the same code over FileRows (below)."""
  init = {"c": np.array([1.5, -2.0], np.float32), "seen": np.array(False)}
  table = HostTable(init, 5, kind="host")
  page = table.gather(np.array([1, 3]))
  np.testing.assert_array_equal(page["c"], [[1.5, -2.0], [1.5, -2.0]])
  page["c"][1] = [7.0, 8.0]
  page["seen"][1] = True
  table.scatter(np.array([1, 3]), page)
  got = table.gather([0, 3, 1])
  np.testing.assert_array_equal(got["c"], [[1.5, -2.0], [7.0, 8.0], [1.5, -2.0]])
  np.testing.assert_array_equal(got["seen"], [False, True, False])
  assert table.tables[1].dtype == bool   # only float32 leaves take the storage dtype


@pytest.mark.parametrize("overrides, message", [
    (dict(client_state_dtype="bfloat16"), "'client_state_dtype' = 'bfloat16' is read by "
     "nothing in this run: it is read with client_state_store 'host' or 'disk'"),
    (dict(client_state_store="host", client_state_dir="/tmp"), "'client_state_dir' = '/tmp' is "
     "read by nothing in this run: it is read with client_state_store 'disk'"),
    (dict(client_state_store="host", algorithm="solo"), "SOLO's evaluation reads every "
     "client's model"),
    (dict(client_state_store="sideways"), "'client_state_store' = 'sideways': allowed values "
     "are device, host, disk"),
])
def test_store_keys_that_would_be_ignored_or_cannot_work_are_refused(overrides, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    make_config(overrides)


def test_a_run_without_per_client_state_refuses_a_host_table():
  x, y, parts = toy_problem()
  with pytest.raises(ConfigError, match="keeps no per-client state"):
    toy_simulation(x, y, parts, client_state_store="host")


def test_file_rows_read_and_write_rows_like_a_numpy_array(tmp_path):
  rows = FileRows((6, 3), ml_dtypes.bfloat16, str(tmp_path))
  assert os.listdir(tmp_path) == []          # unlinked at once
  np.testing.assert_array_equal(rows[[4, 0]], np.zeros((2, 3)))   # never written: zeros
  want = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
  rows[[5, 1]] = want
  np.testing.assert_array_equal(rows[[1, 5, 2]].astype(np.float32), [want[1], want[0], [0] * 3])
  assert rows.nbytes == 6 * 3 * 2


def _run_cli_rounds(out, rounds, resume=False, **overrides):
  from fedjax_dp.experiment.runner import run_experiment
  cfg = make_config(dict(dataset="synthetic", num_clients=24, clients_per_round=7,
                         algorithm="scaffold", rounds=rounds, eval_every=2, checkpoint_every=2,
                         devices=2, **overrides))
  run_experiment(cfg, str(out), resume=resume, progress=False, log=lambda m: None)
  rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


# the host table's resume in `make test-slow` (CI runs it): the disk table's reads the
# same checkpointed rows through the same code
@pytest.mark.parametrize("store", [pytest.param("host", marks=pytest.mark.slow), "disk"])
def test_a_run_with_a_host_table_resumes_from_its_checkpoints_to_the_same_numbers(store,
                                                                                  tmp_path):
  """The table's rows are saved beside each orbax step (checkpoint.save's side folder)
  and read back on --resume: 2 + 2 rounds release what 4 rounds with the device table do."""
  want = _run_cli_rounds(tmp_path / "device", 4)
  out = tmp_path / store
  _run_cli_rounds(out, 2, client_state_store=store)
  assert {"ids.npy", "leaf0.bin", "table.json"} <= set(os.listdir(out / "checkpoints" / "2" /
                                                                 "side"))
  assert _run_cli_rounds(out, 4, resume=True, client_state_store=store) == want
  assert not [n for n in os.listdir(out / "checkpoints") if n.startswith(".")]


@pytest.mark.slow   # ~11 s: make test-slow, so make test stays under 10 minutes
def test_a_damaged_table_falls_back_to_the_previous_checkpoint(tmp_path):
  want = _run_cli_rounds(tmp_path / "device", 6)
  out = tmp_path / "host"
  _run_cli_rounds(out, 4, client_state_store="host")
  leaf = out / "checkpoints" / "4" / "side" / "leaf0.bin"
  raw = bytearray(leaf.read_bytes())
  raw[7] ^= 1
  leaf.write_bytes(bytes(raw))
  from fedjax_dp.experiment.runner import run_experiment
  cfg = make_config(dict(dataset="synthetic", num_clients=24, clients_per_round=7,
                         algorithm="scaffold", rounds=6, eval_every=2, checkpoint_every=2,
                         devices=2, client_state_store="host"))
  said = []
  run_experiment(cfg, str(out), resume=True, progress=False, log=said.append)
  assert any("checkpoint at round 4" in m and "does not match its digest" in m for m in said)
  assert any("resuming" in m and "round 2" in m for m in said)
  rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert [{k: v for k, v in r.items() if k != "wall_s"} for r in rows] == want


def test_a_table_saved_and_loaded_holds_the_same_rows(tmp_path):
  init = {"c": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int32(4)}
  for kind in ("host", "disk"):
    table = HostTable(init, 50, kind=kind, directory=str(tmp_path))
    ids = np.array([3, 17, 49, 0])
    table.scatter(ids, {"c": np.random.default_rng(0).normal(size=(4, 2, 3)),
                        "n": np.array([1, 2, 3, 4], np.int32)})
    table.save(str(tmp_path / f"saved_{kind}"), chunk=3)
    again = HostTable(init, 50, kind=kind, directory=str(tmp_path))
    again.load(str(tmp_path / f"saved_{kind}"), chunk=3)
    every = np.arange(50)
    for a, b in zip(jax.tree.leaves(table.gather(every)), jax.tree.leaves(again.gather(every))):
      np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="is not this run's"):
      HostTable(init, 51, kind=kind).load(str(tmp_path / f"saved_{kind}"))
