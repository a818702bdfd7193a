"""The cohort sharded over 8 simulated CPU devices gives the single-device result."""

import jax
import numpy as np
import pytest

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
