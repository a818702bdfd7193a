"""The cohort sharded over 8 simulated CPU devices gives the single-device result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.placement import executor as executor_lib
from fedjax_dp.placement.executor import map_clients_with_resident_state, map_clients_with_state
from tests.helpers import toy_problem, toy_simulation


@pytest.mark.parametrize("clients_per_round,sampling", [(10, "fixed"), (8, "poisson")])
def test_eight_devices_equal_one(clients_per_round, sampling):
  assert len(jax.devices()) == 8, "conftest.py should give 8 CPU devices"
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))  # 20 clients of unequal size
  results = []
  for devices in (1, 8):
    # 10 cohort slots over 8 devices: padded to 16, the padding must not count
    sim = toy_simulation(x, y, parts, devices=devices, clients_per_round=clients_per_round,
                         sampling=sampling)
    assert sim.mesh.devices.size == devices
    state, stats = sim.run_rounds(sim.init_state(), 4)
    results.append((state, stats))
  (s1, st1), (s8, st8) = results
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(st1.loss_sum), np.asarray(st8.loss_sum), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(st1.participants), np.asarray(st8.participants))
  assert int(s1.participations) == int(s8.participations)


def test_params_stay_replicated_and_cohort_is_sharded():
  x, y, parts = toy_problem(sizes=tuple(range(3, 19)))
  sim = toy_simulation(x, y, parts, devices=8, clients_per_round=16)
  state, _ = sim.run_rounds(sim.init_state(), 1)
  leaf = jax.tree.leaves(state.params)[0]
  assert leaf.sharding.is_fully_replicated
  assert sim.cohort_capacity == 16


def test_clients_with_state_write_their_rows_like_a_plain_loop():
  """24 slots over 8 devices in batches of 2 (a remainder of 1 per device);
  dropped slots (id 30) write nothing, a padded slot repeats a real id."""
  n, d = 30, 5
  rng = np.random.default_rng(0)
  ids = rng.permutation(n)[:24].astype(np.int32)
  write = ids.copy()
  write[[3, 10, 17]] = n                       # refused or padded slots
  ids[10] = ids[11]                            # a padded slot repeating a real id
  table = {"a": rng.normal(size=(n, d)).astype(np.float32),
           "b": rng.integers(0, 9, size=(n,)).astype(np.int32)}
  arg = rng.normal(size=(24,)).astype(np.float32)

  def fn(args, row):
    x, cid = args
    return (2 * x, row["b"]), {"a": row["a"] + x, "b": row["b"] + cid}

  def phase(table, x, ids, write):
    return map_clients_with_state(fn, (x, ids), table, ids, write, batch=2)
  mesh = make_mesh(8)
  run = jax.jit(jax.shard_map(phase, mesh=mesh, in_specs=(P(), P("clients"), P("clients"),
                                                            P("clients")),
                              out_specs=((P("clients"), P("clients")), P())))
  (out_x, out_b), got = run(table, jnp.asarray(arg), jnp.asarray(ids), jnp.asarray(write))
  want = {k: v.copy() for k, v in table.items()}
  for j in range(24):   # every slot reads the round's starting rows (ids distinct among writers)
    if write[j] < n:
      want["a"][ids[j]] = table["a"][ids[j]] + arg[j]
      want["b"][ids[j]] = table["b"][ids[j]] + ids[j]
  np.testing.assert_allclose(np.asarray(out_x), 2 * arg)
  np.testing.assert_array_equal(np.asarray(out_b), table["b"][ids])
  np.testing.assert_allclose(np.asarray(got["a"]), want["a"], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(got["b"]), want["b"])


def test_eight_devices_equal_one_with_per_client_state():
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))
  out = []
  for devices in (1, 8):
    sim = toy_simulation(x, y, parts, devices=devices, clients_per_round=10, sampling="fixed",
                         algorithm="scaffold", s_local=0.5)
    state, _ = sim.run_rounds(sim.init_state(), 4)
    out.append(state)
  for a, b in zip(jax.tree.leaves((out[0].params, out[0].client_state)),
                  jax.tree.leaves((out[1].params, out[1].client_state))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_resident_state_rows_follow_their_slots_like_a_plain_loop():
  """11 slots per device over 8 devices in batches of 4 (a remainder of 3)."""
  rng = np.random.default_rng(1)
  slots, d = 88, 3
  table = {"a": rng.normal(size=(slots, d)).astype(np.float32),
           "b": rng.integers(0, 9, size=(slots,)).astype(np.int32)}
  arg = rng.normal(size=(slots,)).astype(np.float32)

  def fn(x, row):
    return (x * row["b"], row["a"][0]), {"a": row["a"] * x, "b": row["b"] + 1}

  run = jax.jit(jax.shard_map(lambda x, t: map_clients_with_resident_state(fn, x, t, batch=4),
                              mesh=make_mesh(8), in_specs=(P("clients"), P("clients")),
                              out_specs=((P("clients"), P("clients")), P("clients"))))
  (out_x, out_a0), got = run(jnp.asarray(arg), table)
  np.testing.assert_allclose(np.asarray(out_x), arg * table["b"], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(out_a0), table["a"][:, 0])
  np.testing.assert_allclose(np.asarray(got["a"]), table["a"] * arg[:, None], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(got["b"]), table["b"] + 1)


# ~11 s: `make test-slow` (CI runs it); resident rows on 8 devices against 1 are also
# test_eight_devices_equal_one_with_per_client_state
@pytest.mark.slow
def test_resident_state_equals_the_replicated_table(monkeypatch):
  """Full participation keeps each client's state on its device inside a chunk;
  it must give the replicated table's numbers, rows in client order after every
  chunk, and 8 devices must give 1 device's."""
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))   # 20 clients over 8 devices: padded
  out = {}
  monkeypatch.setattr(executor_lib, "table_rows", lambda mesh, num_clients: 0)   # replicated
  for devices, resident in ((8, True), (8, False), (1, True)):
    sim = toy_simulation(x, y, parts, devices=devices, resident_state=resident,
                         algorithm="scaffold+contrastive", s_local=0.5)
    state, _ = sim.run_rounds(sim.init_state(), 2)   # two chunks: the layout goes back and forth
    state, _ = sim.run_rounds(state, 1)
    assert all(a.sharding.is_fully_replicated for a in jax.tree.leaves(state.client_state))
    out[devices, resident] = state
  ref = out[8, False]
  assert np.asarray(ref.client_state["seen"]).all()
  rows = np.asarray(jax.tree.leaves(ref.client_state["prev_model"])[0])
  assert len({r.tobytes() for r in rows}) == 20         # distinct rows: a mix-up would show
  for key in ((8, True), (1, True)):
    for a, b in zip(jax.tree.leaves((ref.params, ref.client_state)),
                    jax.tree.leaves((out[key].params, out[key].client_state))):
      if key == (8, True):   # the same dealing and summation order: the same bits
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      else:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cohort", [
    dict(clients_per_round=7),
    dict(clients_per_round=6, sampling="poisson", max_cohort=12)])
def test_sharded_table_equals_the_replicated_table(cohort, monkeypatch):
  """A partial cohort's per-client table sharded over 8 devices in blocks of ids
  (each device holds ceil(20 / 8) = 3 rows, not 20): the same rows read and
  written as from the replicated table, so the same bits, chunk after chunk."""
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))   # 20 clients: the last block padded
  kw = dict(devices=8, algorithm="scaffold+contrastive", s_local=0.5, **cohort)
  sim = toy_simulation(x, y, parts, **kw)
  working = sim.to_working(sim.init_state())
  for leaf in jax.tree.leaves(working.client_state):
    assert leaf.shape[0] == 24 and leaf.sharding.spec == P("clients")
    assert {s.data.shape[0] for s in leaf.addressable_shards} == {3}
  out = {}
  for table in ("sharded", "replicated"):
    if table == "replicated":
      monkeypatch.setattr(executor_lib, "table_rows", lambda mesh, num_clients: 0)
      sim = toy_simulation(x, y, parts, **kw)
    state, s1 = sim.run_rounds(sim.init_state(), 2)   # two chunks: the layout goes back and forth
    state, s2 = sim.run_rounds(state, 3)
    assert all(a.sharding.is_fully_replicated and a.shape[0] == 20
               for a in jax.tree.leaves(state.client_state))
    out[table] = (state, s1, s2)
  seen = np.asarray(out["sharded"][0].client_state["seen"])
  assert 0 < seen.sum() < 20            # some rows written, some never: both must agree
  for a, b in zip(jax.tree.leaves(out["sharded"]), jax.tree.leaves(out["replicated"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_working_layout_kept_between_chunks_equals_run_rounds():
  """fedjax-dp run keeps resident state in the dealing layout from chunk to chunk
  (run_working) and converts only where it reads it: the same bits as
  run_rounds, which converts at every chunk's ends; one compilation per chunk
  length, the first chunk's input laid out like the later ones'."""
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))
  sim = toy_simulation(x, y, parts, devices=8, algorithm="scaffold+contrastive", s_local=0.5)
  s0 = sim.init_state()
  rows = {len(jax.tree.leaves(s0.client_state)[0])}
  ref, _ = sim.run_rounds(sim.init_state(), 2)
  ref, ref_stats = sim.run_rounds(ref, 2)
  w = sim.to_working(s0)
  rows.add(len(jax.tree.leaves(w.client_state)[0]))
  assert rows == {20, 24}          # 20 clients in client order, 24 slots in dealing order
  w, _ = sim.run_working(w, 2)
  w, stats = sim.run_working(w, 2)
  assert sim.run_chunk._cache_size() == 1
  got = sim.to_client_order(w)
  for a, b in zip(jax.tree.leaves((ref.params, ref.client_state, ref_stats)),
                  jax.tree.leaves((got.params, got.client_state, stats))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert all(a.sharding.is_fully_replicated for a in jax.tree.leaves(got.client_state))


def test_resident_state_needs_full_participation():
  x, y, parts = toy_problem(sizes=tuple(range(3, 23)))
  with pytest.raises(ValueError, match="resident_state needs every client"):
    toy_simulation(x, y, parts, clients_per_round=10, algorithm="scaffold", resident_state=True)


# without resident state in `make test-slow` (CI runs it)
@pytest.mark.parametrize("resident", [pytest.param(False, marks=pytest.mark.slow), True])
def test_clients_one_at_a_time_equal_vmapped_groups(resident):
  """client_batch 1 runs each client's loop unbatched (no per-step select of the
  carry); groups of 3 (with a remainder of 1 on each of 2 devices: 7 slots) run
  vmapped. Same numbers, with per-client state and the client pipeline."""
  x, y, parts = toy_problem(sizes=tuple(range(3, 17)))   # 14 clients over 2 devices
  out = []
  for batch in (1, 3):
    sim = toy_simulation(x, y, parts, devices=2, resident_state=resident, client_batch=batch,
                         algorithm="scaffold+contrastive", s_local=0.5)
    state, stats = sim.run_rounds(sim.init_state(), 3)
    out.append((state, stats))
  (s1, st1), (s3, st3) = out
  assert np.asarray(s1.client_state["seen"]).all()
  for a, b in zip(jax.tree.leaves((s1.params, s1.client_state)),
                  jax.tree.leaves((s3.params, s3.client_state))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(st1.loss_sum), np.asarray(st3.loss_sum), rtol=1e-5)


def test_resident_state_keeps_a_refused_clients_rows():
  """Resident state drops the keep-the-old-row selects where only padding can sit
  out; with per-client budgets a real client is refused and must keep its rows
  (previous model, residual, seen) exactly while the others' move on."""
  from fedjax_dp.core.build import build_simulation
  from fedjax_dp.recipes.plan import plan_run
  x, y, parts = toy_problem(sizes=(9, 12, 7, 10, 8), features=4, seed=2)  # 5 over 2: padded
  base = toy_simulation(x, y, parts, devices=2, dp="local", noise_multiplier=15.0,
                        target_epsilon=3.0, algorithm="contrastive", s_local=0.5,
                        index_selection="random_k")   # local DP refuses top-k indices
  sim = build_simulation(plan_run(base.cfg, base.model,
                                  client_budgets=np.array([1.0, 2.0, 3.0, 1.5, 2.5])),
                         base.model, base.store, base.mesh)
  state = sim.init_state()
  refused_rounds = 0
  for _ in range(25):
    before = jax.tree.map(np.array, state)      # run_rounds donates its input
    state, _ = sim.run_rounds(state, 1)
    took = (np.asarray(state.server_state["noise_control"]["participations"])
            > np.asarray(before.server_state["noise_control"]["participations"]))
    for a, b in zip(jax.tree.leaves(before.client_state), jax.tree.leaves(state.client_state)):
      a, b = np.asarray(a), np.asarray(b)
      np.testing.assert_array_equal(a[~took], b[~took])
    refused_rounds += int((~took).sum() > 0 and took.any())
  assert refused_rounds >= 15   # refused and training clients side by side (3, 7, 12, 18, 25 rounds)
