"""The one-step path (core/one_step.py): clients whose local work is one SGD step
run as one gradient over the cohort's examples, with the per-client loop's numbers."""

import jax
import numpy as np
import pytest

from fedjax_dp.errors import ConfigError
from tests.helpers import toy_problem, toy_simulation
from tests.test_fedavg_reference import reference_rounds

SIZES = (7, 12, 3, 9, 5, 8, 0, 11)   # an empty client too
ONE_STEP = dict(local_epochs=1, batch_size=12)


def _params(sim, rounds, hparams=None):
  state, stats = sim.run_rounds(sim.init_state(), rounds)
  return [np.asarray(a) for a in jax.tree.leaves(state.params)], stats


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(algorithm="fedavgm", server_lr=0.7, server_momentum=0.9, clients_per_round=5),
    dict(lr_schedule="cosine", lr=0.2, lr_min=0.02, rounds=3),
])
def test_one_step_equals_python_loop(overrides):
  x, y, parts = toy_problem(sizes=SIZES)
  sim = toy_simulation(x, y, parts, **ONE_STEP, **overrides)
  assert sim.client_parallelism == "one_step"          # auto picks it
  got, stats = _params(sim, 3)
  want = reference_rounds(sim, x, y, parts, 3)
  for g, w in zip(got, jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
  cohort = sim.cfg.clients_per_round
  assert int(np.asarray(stats.participants)[0]) == cohort


@pytest.mark.parametrize("devices,client_batch", [(1, 0), (1, 2), (2, 0), (4, 3)])
def test_one_step_equals_map_path(devices, client_batch):
  """Same rounds (Poisson cohorts, padded slots, chunks of client_batch clients,
  devices) as the per-client loop, to float summation order; same statistics."""
  x, y, parts = toy_problem(sizes=SIZES, seed=1)
  common = dict(ONE_STEP, sampling="poisson", clients_per_round=5, max_cohort=8,
                devices=devices)
  fast = toy_simulation(x, y, parts, client_parallelism="one_step", client_batch=client_batch,
                        **common)
  loop = toy_simulation(x, y, parts, client_parallelism="map", **common)
  (a, sa), (b, sb) = _params(fast, 4), _params(loop, 4)
  for u, v in zip(a, b):
    np.testing.assert_allclose(u, v, atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(sa.loss_sum), np.asarray(sb.loss_sum), rtol=1e-5)
  for field in ("examples", "participants", "unclipped", "nonfinite"):
    np.testing.assert_array_equal(np.asarray(getattr(sa, field)), np.asarray(getattr(sb, field)))


@pytest.mark.parametrize("overrides,why", [
    (dict(local_epochs=2), "local_epochs is not 1"),
    (dict(batch_size=8), "a client holds 12 examples, more than batch_size 8"),
    (dict(algorithm="fedprox", prox_mu=0.1), "the local terms fedprox change the step"),
    (dict(algorithm="scaffold"), "the local terms scaffold change the step"),
    (dict(s_local=0.5), "an upload stage"),
    (dict(dp="local", noise_multiplier=1.0, local_noise_draw="client"),
     "a stage reads each upload"),
    (dict(aggregator="median"), "a stage reads each upload"),
    (dict(byzantine_fraction=0.2), "a stage reads each upload"),
])
def test_one_step_refused_where_a_client_does_more(overrides, why):
  """auto falls back to the per-client loop; asked for by name, one line says why."""
  x, y, parts = toy_problem(sizes=SIZES)
  values = dict(ONE_STEP, **overrides)
  assert toy_simulation(x, y, parts, **values).client_parallelism == "map"
  with pytest.raises(ConfigError, match="'client_parallelism' = 'one_step': " + why):
    toy_simulation(x, y, parts, client_parallelism="one_step", **values)


def test_one_step_hparams_are_data():
  """The lr is read from the hyperparameter pytree: no recompilation, the new numbers."""
  x, y, parts = toy_problem(sizes=SIZES)
  sim = toy_simulation(x, y, parts, **ONE_STEP)
  other = sim.with_hparams(lr=0.3)
  assert other.run_chunk is sim.run_chunk
  got, _ = _params(other, 2)
  want = reference_rounds(other, x, y, parts, 2)
  for g, w in zip(got, jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
