"""Small in-memory problems shared by the tests."""

import numpy as np

from fedjax_dp.config import make_config
from fedjax_dp.models import make_model
from fedjax_dp.simulation import build_simulation, make_mesh
from fedjax_dp.store import build_store


def toy_problem(sizes=(7, 12, 3), features=6, classes=3, seed=0):
  """Random features, labels and a partition with the given client sizes."""
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  x = rng.normal(size=(n, features)).astype(np.float32)
  y = rng.integers(0, classes, size=n).astype(np.int32)
  perm = rng.permutation(n)
  parts, start = [], 0
  for s in sizes:
    parts.append(perm[start:start + s])
    start += s
  return x, y, parts


def toy_simulation(x, y, parts, devices=1, classes=3, **overrides):
  values = dict(num_clients=len(parts), clients_per_round=len(parts), hidden=[5],
                batch_size=4, local_epochs=2, lr=0.1, momentum=0.5, devices=devices)
  values.update(overrides)
  cfg = make_config(values)
  model = make_model(cfg.model, x.shape[1:], classes, cfg.hidden)
  store = build_store(x, y, parts, pad_to_multiple=cfg.batch_size)
  return build_simulation(cfg, model, store, make_mesh(devices))
