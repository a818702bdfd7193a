"""The executor decides how clients run from the stages' properties (placement/executor.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.placement import executor as executor_lib
from fedjax_dp.placement.executor import VMAP_GROUP, plan_executor
from fedjax_dp.robust import AGGREGATORS, register_aggregator
from fedjax_dp.robust.base import Aggregator, metrics
from tests.helpers import flat, keyed_state, toy_problem, toy_simulation

BASE = dict(parallelism="auto", client_batch=3, slots=8, num_clients=8, per_client_state=False,
            full_participation=False, resident=None, stacks_uploads=False,
            refuses_clients=False)


def plan(**kw):
  return plan_executor(make_mesh(1), **{**BASE, **kw})


def test_plan_reads_properties():
  e = plan()
  auto = "map" if jax.default_backend() == "cpu" else "vmap"   # by platform
  assert (e.parallelism, e.batch, e.resident, e.fused_sum, e.keep_rows) == (
      auto, 3, False, True, False)                       # in groups of client_batch
  assert plan(parallelism="vmap").batch == 3              # vmap: groups of client_batch
  assert plan(parallelism="vmap", client_batch=0).batch == 8   # default: up to VMAP_GROUP
  assert plan(parallelism="vmap", client_batch=0, slots=1000).batch == VMAP_GROUP
  assert plan(parallelism="map", client_batch=0).batch == 1    # map: one client at a time
  e = plan(one_step_width=6, client_batch=0)               # every client one plain step
  assert (e.parallelism, e.width, e.batch) == ("one_step", 6, 8)
  assert plan(one_step_width=6, parallelism="map").width == 0
  with pytest.raises(ValueError, match="one plain SGD step"):
    plan(parallelism="one_step")
  assert not plan(stacks_uploads=True).fused_sum          # a stage reads the stack: stacked
  assert not plan(full_participation=True).resident       # no per-client state: nothing resident
  e = plan(full_participation=True, per_client_state=True, refuses_clients=True)
  assert e.resident and e.keep_rows
  assert not plan(full_participation=True, per_client_state=True, resident=False).resident
  with pytest.raises(ValueError, match="num_clients = 8"):
    plan(resident=True)
  # a table that is not resident: sharded in blocks of ids over several devices
  assert plan(per_client_state=True).table_rows == 0       # one device: replicated (all of it)
  two = lambda **kw: plan_executor(make_mesh(2), **{**BASE, "slots": 8, **kw})
  assert two(per_client_state=True, num_clients=9).table_rows == 5   # ceil(9 / 2)
  assert two(per_client_state=True, shard_table=False).table_rows == 0
  assert two(per_client_state=False).table_rows == 0       # no table
  assert two(per_client_state=True, full_participation=True).table_rows == 0   # resident


def _weighted_mean(u, mask, weights, state, hp):
  w = jnp.where(mask, weights, 0.0)
  return jnp.sum(w[:, None] * u, axis=0) / jnp.maximum(jnp.sum(w), 1.0), state, metrics()


@pytest.fixture
def user_mean():
  """A user's rule registered with linear=False: the same weighted mean, but the
  executor must stack the uploads and call it."""
  register_aggregator(Aggregator("user_mean", _weighted_mean))
  yield "user_mean"
  del AGGREGATORS["user_mean"]


def test_a_user_rule_runs_stacked_and_agrees_with_the_fused_mean(user_mean):
  """The fused in-loop sum (mean: linear) and the stacked uploads handed to a
  user's rule (linear=False) are the same FedAvg step up to float summation."""
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9))
  out = {}
  for rule in ("mean", user_mean):
    sim = toy_simulation(x, y, parts, aggregator=rule, clients_per_round=3)
    out[rule] = sim.run_rounds(keyed_state(sim), 2, same_draws=True)[0].params   # the same draws
  np.testing.assert_allclose(flat(out["mean"]), flat(out[user_mean]), rtol=2e-5, atol=1e-6)
  assert not np.array_equal(flat(out["mean"]), flat(jax.tree.map(jnp.zeros_like,
                                                                 out["mean"])))


def _two_example_clients(clients: int, rng):
  """(x, y, parts): `clients` clients of 2 random examples of 100 features, 3 classes."""
  x = rng.normal(size=(2 * clients, 100)).astype(np.float32)
  y = rng.integers(0, 3, size=2 * clients).astype(np.int32)
  return x, y, np.split(np.arange(2 * clients), clients)


def _temp_bytes(sim) -> int:
  """The compiled round's temporary buffers (XLA's own memory analysis)."""
  state = sim.init_state()
  compiled = sim.run_chunk.lower(state, sim.store, sim.hparams, 1).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow   # ~13 s: make test-slow, so make test stays under 10 minutes
def test_vmap_memory_is_set_by_the_group_not_the_cohort():
  """A vmap round holds [VMAP_GROUP, d] per-client copies, never [cohort, d]: the
  compiled round's temporary memory (XLA's analysis) at 100,000 clients stays
  under 256 MB and within 1.5x of 10,000 clients' (measured: 104 and 141 MB;
  the whole 10,000-client cohort vmapped at once, as before issue 20: 3.9 GB)."""
  rng = np.random.default_rng(0)
  temps = {}
  for clients in (10000, 100000):
    x, y, parts = _two_example_clients(clients, rng)
    sim = toy_simulation(x, y, parts, client_parallelism="vmap", hidden=[200], batch_size=2)
    assert sim.cfg.client_batch == 0
    temps[clients] = _temp_bytes(sim)
  assert temps[100000] < 256 * 2**20, temps
  assert temps[100000] < 1.5 * temps[10000], temps


@pytest.mark.parametrize("dp", ["central", "local"])
def test_dp_client_half_in_the_loop_equals_it_over_the_stack(dp):
  """DP's client half (clip, local noise) runs per upload inside the client loop's
  sum; a stage that needs the stack (server clipping, here at a bound no upload
  reaches) makes the round run it vmapped over the stacked uploads instead. Same
  keys, same clips: the same round to float summation order, the same counts."""
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9, 5, 8), seed=2)
  out = {}
  # each report's own noise on both (the fused sum would draw the reports' noise for
  # their sum: the same distribution, other bits)
  draw = {"local_noise_draw": "client"} if dp == "local" else {}
  for server_clip in (None, 1e9):
    sim = toy_simulation(x, y, parts, dp=dp, noise_multiplier=0.7, clip_norm=0.5,
                         clients_per_round=4, sampling="fixed", server_clip_l2=server_clip,
                         **draw)
    state, stats = sim.run_rounds(keyed_state(sim), 3, same_draws=True)   # the same draws
    out[server_clip] = (flat(state.params), np.asarray(stats.unclipped),
                        np.asarray(stats.participants))
  fused, stacked = out[None], out[1e9]
  np.testing.assert_allclose(fused[0], stacked[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(fused[1], stacked[1])
  np.testing.assert_array_equal(fused[2], stacked[2])
  assert 0 < fused[1].sum() < fused[2].sum()   # some uploads clipped, some not


@pytest.mark.parametrize("dp", ["central", "local"])
def test_dp_round_memory_is_set_by_the_group_not_the_cohort(dp):
  """With DP's client half inside the loop, a DP round holds no [cohort, d]
  stack of uploads: the compiled round's temporary memory (XLA's analysis)
  grows from 2,000 to 20,000 clients by under a twentieth of an upload a client
  (measured: 1.6 and 13.9 MB, 680 bytes a client for its ids, keys, rows and
  statistics, against 83 KB an upload: the stack would be 1.7 GB, and the
  README's 30,000-client local DP example peaked at 16 GB resident with it)."""
  rng = np.random.default_rng(0)
  temps = {}
  for clients in (2000, 20000):
    x, y, parts = _two_example_clients(clients, rng)
    sim = toy_simulation(x, y, parts, hidden=[200], batch_size=2, dp=dp, noise_multiplier=1.0,
                         clip_norm=1.0, sampling="fixed")
    temps[clients] = _temp_bytes(sim)
  d = 100 * 200 + 200 + 200 * 3 + 3
  per_client = (temps[20000] - temps[2000]) / 18000
  assert per_client < 4 * d / 20, (temps, per_client)


def test_vmap_in_groups_on_8_devices_equals_the_map_loop():
  """The GPU path at a GPU's group size: 2,100 clients over 8 devices, 263 slots
  a device run as a vmapped group of 256 and one of 7, against one device's
  per-client loop (to float summation order)."""
  sizes = tuple(1 + i % 5 for i in range(2100))
  x, y, parts = toy_problem(sizes=sizes, seed=3)
  out = {}
  for parallelism, devices in (("vmap", 8), ("map", 1)):
    sim = toy_simulation(x, y, parts, devices=devices, client_parallelism=parallelism)
    state, stats = sim.run_rounds(sim.init_state(), 2)
    out[parallelism] = (flat(state.params), np.asarray(stats.loss_sum))
  assert sim.cfg.client_batch == 0
  np.testing.assert_allclose(out["vmap"][0], out["map"][0], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(out["vmap"][1], out["map"][1], rtol=1e-4)


@pytest.mark.parametrize("table", ["resident", "sharded", "replicated"])
def test_the_client_loop_never_copies_the_per_client_table(table, monkeypatch):
  """SCAFFOLD reads each client's old control variate after writing the new one
  (c_i^+ - c_i); XLA used to keep the old row by copying the whole [clients, d]
  table in every step of the client loop, so a round cost O(clients^2). The
  compiled round must hold no copy of a table-sized buffer (executor._read_rows)."""
  n = 64
  x, y, parts = toy_problem(sizes=(2,) * n, seed=4)
  if table == "replicated":
    monkeypatch.setattr(executor_lib, "table_rows", lambda mesh, num_clients: 0)
  sim = toy_simulation(x, y, parts, devices=2, algorithm="scaffold", local_epochs=1,
                       resident_state=None if table == "resident" else False)
  assert sim.client_parallelism == "map"
  state = sim.to_working(sim.init_state())
  hlo = sim.run_chunk.lower(state, sim.store, sim.hparams, 1).compile().as_text()
  local = n if table == "replicated" else n // 2     # the table's rows on one device
  shapes = {"f32[%s]" % ",".join(map(str, (local,) + leaf.shape[1:]))
            for leaf in jax.tree.leaves(state.client_state)}
  assert len(shapes) == 4                           # SCAFFOLD's c_i: 2 kernels, 2 biases
  copies = [line for line in hlo.splitlines()
            if " copy(" in line and re.search(r"= (f32\[[\d,]+\])", line)
            and re.search(r"= (f32\[[\d,]+\])", line).group(1) in shapes]
  assert not copies, copies[:3]
