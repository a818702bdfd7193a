"""The trained semantic network, kept on disk between runs.

The analyzer's semantic branch (`semantic.py`) is trained on a public synthetic
cohort (`analyzer.training_set`), never on a run's data, so every run with the same
seed and step count trains the same network: about 10 s of a 50 s dynamic-DP run
on 2 cores. A run stores the trained arrays once and later runs load them, as a
deployment ships its pretrained client model.

A file is used only when everything the training reads is unchanged: its name is a
SHA-256 over the seed, the step count, the source of the modules that generate the
training set and train the network, the JAX, jaxlib, NumPy and optax versions,
the platform and XLA_FLAGS (compiler flags may change the last bits). Inside, a SHA-256
of the arrays is checked on load; a file that fails it is trained again and
replaced. Writes go to a temporary file renamed into place, so a reader never sees
half a file.

Where: $FEDJAX_DP_CACHE/semantic, else $XDG_CACHE_HOME/fedjax-dp/semantic, else
~/.cache/fedjax-dp/semantic. FEDJAX_DP_CACHE=off trains in every process.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tempfile
import zipfile

import numpy as np

FORMAT = 1


def cache_dir() -> str | None:
  """The folder for trained networks, or None where FEDJAX_DP_CACHE=off (privacy/cache.py)."""
  from fedjax_dp.privacy import cache
  return cache.folder("semantic")


def model_key(seed: int, steps: int) -> str:
  """SHA-256 of what the trained network depends on (module docstring)."""
  import jax
  import jaxlib
  import optax
  from fedjax_dp.data import tabular
  from fedjax_dp.privacy.tiers import analyzer, semantic, sensitivity
  h = hashlib.sha256(json.dumps({
      "format": FORMAT, "seed": int(seed), "steps": int(steps),
      "jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": np.__version__,
      "optax": optax.__version__,                     # the networks' Adam
      "platform": jax.devices()[0].platform, "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }, sort_keys=True).encode())
  for module in (analyzer, semantic, sensitivity, tabular):
    with open(module.__file__, "rb") as f:
      h.update(f.read())
  return h.hexdigest()


def _arrays_digest(arrays: dict[str, np.ndarray]) -> str:
  h = hashlib.sha256()
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def load(path: str) -> tuple[dict[str, np.ndarray], dict] | None:
  """(arrays, metadata) from `path`, or None when it is missing or fails its digest."""
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files if k != "__meta__"}
      meta = json.loads(bytes(z["__meta__"]).decode())
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return None
  if meta.get("digest") != _arrays_digest(arrays):
    return None
  return arrays, meta


def save(path: str, arrays: dict[str, np.ndarray], meta: dict) -> bool:
  """Writes atomically; False (and a note on stderr) where the folder is not writable."""
  meta = dict(meta, digest=_arrays_digest(arrays))
  buf = io.BytesIO()
  np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
  tmp = None
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      f.write(buf.getvalue())
    os.replace(tmp, path)
  except OSError as e:
    if tmp is not None and os.path.exists(tmp):
      os.remove(tmp)
    print(f"note: the trained semantic network was not cached ({e})", file=sys.stderr)
    return False
  return True
