"""Many small local steps as low-rank updates of the shared model
(core/low_rank_steps.py): the per-client loop's numbers to float summation order,
and where the executor picks the path."""

import numpy as np
import pytest

from fedjax_dp.errors import ConfigError
from tests.helpers import assert_same_as_loop, toy_problem, toy_simulation

SIZES = (7, 12, 3, 9, 5, 8, 0, 11)   # uneven step counts, an empty client
STEPS = dict(local_epochs=2, batch_size=4, lr=0.3, hidden=[16])


@pytest.mark.parametrize("overrides,devices,client_batch", [
    (dict(), 1, 0),
    (dict(momentum=0.0, local_epochs=3), 2, 3),
    (dict(sampling="poisson", clients_per_round=5, max_cohort=8, lr_schedule="cosine",
          lr_min=0.05), 4, 0),
    (dict(algorithm="fedavgm", server_lr=0.7, server_momentum=0.9, hidden=[16, 8]), 1, 2),
    (dict(dp="central", clip_norm=0.3, noise_multiplier=0.3), 2, 0),
    (dict(dp="central", clip_norm=0.3, noise_multiplier=0.3, clip_parts="per_layer",
          adaptive_clipping=True), 1, 3),
    (dict(dp="local", clip_norm=0.3, noise_multiplier=0.3), 4, 0),
    (dict(local_epochs=1, batch_size=12), 1, 0),   # one step: by name it runs here too
])
def test_low_rank_steps_equal_the_per_client_loop(overrides, devices, client_batch):
  """Same rounds as local_train's loop (its epoch orders, batches, momentum trace;
  DP's clip of each delta), statistics too, on 1 and several devices, in chunks."""
  x, y, parts = toy_problem(sizes=SIZES, seed=1)
  common = dict(STEPS, devices=devices, **overrides)
  fast = toy_simulation(x, y, parts, client_parallelism="low_rank", client_batch=client_batch,
                        **common)
  loop = toy_simulation(x, y, parts, client_parallelism="map", **common)
  sa = assert_same_as_loop(fast, loop, "low_rank")
  if "dp" in overrides:
    unclipped = int(np.sum(sa.metrics["mechanism"]["unclipped"]))
    assert 0 < unclipped < int(np.sum(sa.participants))


def test_auto_picks_low_rank_where_the_corrections_are_cheap():
  """Wide inputs, few steps: auto runs the low-rank path; the toy model's narrow
  layers (corrections dearer than the shared matmuls) stay on the loop."""
  x, y, parts = toy_problem(sizes=(6, 5, 6, 3), features=256, seed=2)
  wide = dict(local_epochs=2, batch_size=3, hidden=[64])
  assert toy_simulation(x, y, parts, **wide).client_parallelism == "low_rank"
  x, y, parts = toy_problem(sizes=SIZES)
  assert toy_simulation(x, y, parts, **STEPS).client_parallelism == "map"


@pytest.mark.parametrize("overrides,why", [
    (dict(algorithm="fedprox", prox_mu=0.1), "the local terms fedprox change the step"),
    (dict(s_local=0.5), "an upload stage"),
    (dict(aggregator="median"), "a stage reads each upload"),
    (dict(local_epochs=20, batch_size=1), "a client takes up to 240 local steps, more than 64"),
])
def test_low_rank_refused_where_it_does_not_apply(overrides, why):
  x, y, parts = toy_problem(sizes=SIZES)
  values = dict(STEPS, **overrides)
  assert toy_simulation(x, y, parts, **values).client_parallelism == "map"
  with pytest.raises(ConfigError, match="'client_parallelism' = 'low_rank': " + why):
    toy_simulation(x, y, parts, client_parallelism="low_rank", **values)


def test_low_rank_refuses_convolutions():
  x, y, parts = toy_problem(sizes=SIZES, features=16)
  with pytest.raises(ConfigError, match="parameters outside dense layers"):
    toy_simulation(x.reshape(-1, 4, 4, 1), y, parts, client_parallelism="low_rank",
                   **dict(STEPS, model="cnn", hidden=[5]))
