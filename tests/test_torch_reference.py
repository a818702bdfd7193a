"""Cross-check against a trusted library: the compiled round equals the PyTorch loop.

Same initial weights, same per-epoch example orders (derived from our keys),
momentum SGD in both: after two rounds the models agree to float tolerance.
"""

import os
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="install torch==2.13.0 (make bench) to run")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from torch_fedavg import fedavg_round, make_mlp  # noqa: E402

from fedjax_dp.core.state import CLIENT_TRAINING  # noqa: E402
from tests.helpers import toy_problem, toy_simulation  # noqa: E402


def to_torch_state(params, model):
  """Flax Dense kernels are [in, out]; torch Linear weights are [out, in]."""
  state = {}
  linear = [m for m in model if isinstance(m, torch.nn.Linear)]
  for i, layer in enumerate(linear):
    dense = params[f"Dense_{i}"]
    state[f"{list(model).index(layer)}.weight"] = torch.tensor(np.asarray(dense["kernel"]).T)
    state[f"{list(model).index(layer)}.bias"] = torch.tensor(np.asarray(dense["bias"]))
  return state


def test_two_rounds_match_pytorch():
  torch.set_num_threads(1)
  x, y, parts = toy_problem(sizes=(9, 14, 5))
  sim = toy_simulation(x, y, parts, local_epochs=2, batch_size=4, lr=0.1, momentum=0.5)
  start = jax.tree.map(np.array, sim.init_state())   # host copies: run_rounds donates its state
  state, _ = sim.run_rounds(sim.init_state(), 2)

  model = make_mlp(6, (5,), 3).double()
  model.load_state_dict({k: v.double() for k, v in
                         to_torch_state(start.params, model).items()})
  xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.int64)
  clients = [torch.tensor(p) for p in parts]
  run_key = start.key   # the release's run key (recipes/release_identity.py)
  for r in range(2):
    client_key = jax.random.fold_in(jax.random.fold_in(run_key, r), CLIENT_TRAINING)
    perms = []
    for c, p in enumerate(parts):
      keys = jax.random.split(jax.random.fold_in(client_key, c), sim.cfg.local_epochs)
      orders = []
      for k in keys:
        u = np.array(jax.random.uniform(k, (sim.store.max_examples,)))
        u[len(p):] = 2.0
        orders.append(torch.tensor(np.argsort(u, kind="stable")[:len(p)]))
      perms.append(orders)
    # all 3 clients take part every round; the average does not depend on their order
    fedavg_round(model, xt, yt, clients, local_epochs=2, batch_size=4, lr=0.1, momentum=0.5,
                 generator=None, permutations=perms)

  want = to_torch_state(state.params, make_mlp(6, (5,), 3))
  got = model.state_dict()
  for k in want:
    np.testing.assert_allclose(got[k].numpy(), want[k].numpy().astype(np.float64),
                               atol=2e-5, rtol=1e-4)
