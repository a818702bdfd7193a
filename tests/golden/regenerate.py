"""Regenerates tests/golden/round_hashes.json in two steps, for when this machine is
not of the kind whose XLA:CPU bits the file records (test_golden.py's docstring):

  # 1. on a machine of that kind (x86 with AVX-512, e.g. a lent device machine, with
  #    the project's dependencies importable): every case's final state and stats
  python tests/golden/regenerate.py states /tmp/golden_states.pkl
  # 2. here: the report digests from those states, with this checkout's code and
  #    pinned dependency versions (the report is host arithmetic), and the file
  python tests/golden/regenerate.py write /tmp/golden_states.pkl

On a machine of that kind, FEDJAX_DP_UPDATE_GOLDEN=1 (test_golden.py) does both at
once. Step 2 reproduced all 52 recorded digests of the commit before issue 39's
run-key change from an Intel Xeon's states (jax 0.11.2 there) on an AMD EPYC
without AVX-512, which computes its own bits.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _environment() -> None:
  """test_golden's environment (conftest.py's flags) before JAX starts."""
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                        "--xla_backend_optimization_level=0")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")
  sys.path.insert(0, ROOT)


def states(path: str) -> None:
  """Every case's (state digest, stats digest, final state, stats) as numpy, pickled."""
  _environment()
  import jax
  import numpy as np
  from tests import test_golden as g
  out = {}
  for name in sorted(g.CONFIGS):
    for devices in (1, 2):
      sim, state, stats = g.run_case(name, devices)
      state, stats = jax.tree.map(np.asarray, state), [jax.tree.map(np.asarray, s) for s in stats]
      out.setdefault(name, {})[devices] = (g.state_digest(state), g.stats_digest(stats), state,
                                           stats)
  with open(path, "wb") as f:
    pickle.dump(out, f)


def write(paths: list[str]) -> None:
  """round_hashes.json from pickled states: their state and stats digests, and the
  privacy report of each state composed here."""
  _environment()
  import jax
  import jax.numpy as jnp
  from tests import test_golden as g
  golden = {}
  for path in paths:
    with open(path, "rb") as f:
      for name, by_devices in pickle.load(f).items():
        for devices, (state_digest, stats_digest, state, stats) in by_devices.items():
          sim = g.case_simulation(name, int(devices))
          report = g.report_digest(sim, jax.tree.map(jnp.asarray, state), stats)
          golden.setdefault(name, {})[str(devices)] = {
              "state": state_digest, "stats": stats_digest, "report": report}
  tmp = g.GOLDEN + f".{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(golden, f, indent=1, sort_keys=True)
  os.replace(tmp, g.GOLDEN)
  print(f"{g.GOLDEN}: {sum(len(v) for v in golden.values())} cases")


if __name__ == "__main__":
  if len(sys.argv) < 3 or sys.argv[1] not in ("states", "write"):
    sys.exit("usage: regenerate.py states OUT.pkl | write STATES.pkl...")
  states(sys.argv[2]) if sys.argv[1] == "states" else write(sys.argv[2:])
