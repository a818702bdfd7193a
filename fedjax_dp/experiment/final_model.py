"""The trained model a run leaves in its folder: `model.msgpack`, parameters only.

Written at the end of every run that did not diverge (flax's msgpack of the
parameter tree: nested dicts of arrays, readable without the model's code).
Load it with `fedjax_dp.load_params(run_dir)` and apply it with the model that
trained it. SOLO trains no global model: the file holds every client's model,
stacked on a leading [num_clients] axis, under 'client_models'.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from fedjax_dp.errors import RunError
from fedjax_dp.placement.processes import is_primary

FILE = "model.msgpack"


def save(out: str, params: Any, key: str = "params") -> str:
  """Writes {key: params} (host copies) to out/model.msgpack through a temporary
  file and a rename; returns the path."""
  from flax import serialization
  path = os.path.join(out, FILE)
  if not is_primary():
    return path
  host = jax.tree.map(lambda a: np.asarray(jax.device_get(a)), params)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(serialization.msgpack_serialize({key: host}))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return path


def load_params(run_dir: str) -> Any:
  """The trained parameters of the run in `run_dir` (its model.msgpack): the tree
  `model.apply` takes; for SOLO, {'client_models': [num_clients, ...] tree}.
  RunError (one line) when the folder holds no saved model."""
  from flax import serialization
  path = os.path.join(run_dir, FILE)
  if not os.path.isfile(path):
    why = ("the run diverged (summary.json: diverged)" if _diverged(run_dir) else
           "it is not a finished run of this version")
    raise RunError(f"{run_dir} holds no {FILE}: {why}")
  with open(path, "rb") as f:
    tree = serialization.msgpack_restore(f.read())
  return tree["params"] if set(tree) == {"params"} else tree


def _diverged(run_dir: str) -> bool:
  import json
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      return bool(json.load(f).get("diverged"))
  except (OSError, ValueError):
    return False
