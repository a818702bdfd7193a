"""The executor decides how clients run from the stages' properties (placement/executor.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.placement.executor import plan_executor
from fedjax_dp.robust import AGGREGATORS, register_aggregator
from fedjax_dp.robust.base import Aggregator, metrics
from tests.helpers import flat, toy_problem, toy_simulation

BASE = dict(parallelism="auto", client_batch=3, slots=8, num_clients=8, per_client_state=False,
            full_participation=False, resident=None, inspects_uploads=False,
            refuses_clients=False)


def plan(**kw):
  return plan_executor(make_mesh(1), **{**BASE, **kw})


def test_plan_reads_properties():
  e = plan()
  assert (e.parallelism, e.batch, e.resident, e.fused_sum, e.keep_rows) == (
      "map", 3, False, True, False)                      # CPU: lax.map in groups of client_batch
  assert plan(parallelism="vmap").batch == 8              # vmap: the device's whole slice
  assert not plan(inspects_uploads=True).fused_sum        # a stage reads each upload: stacked
  assert not plan(full_participation=True).resident       # no per-client state: nothing resident
  e = plan(full_participation=True, per_client_state=True, refuses_clients=True)
  assert e.resident and e.keep_rows
  assert not plan(full_participation=True, per_client_state=True, resident=False).resident
  with pytest.raises(ValueError, match="num_clients = 8"):
    plan(resident=True)


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
    out[rule] = sim.run_rounds(sim.init_state(), 2)[0].params
  np.testing.assert_allclose(flat(out["mean"]), flat(out[user_mean]), rtol=2e-5, atol=1e-6)
  assert not np.array_equal(flat(out["mean"]), flat(jax.tree.map(jnp.zeros_like,
                                                                 out["mean"])))
