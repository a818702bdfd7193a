"""Correlated-noise strategies optimised once per parameter set and kept on disk.

An optimised strategy depends only on its parameters (rounds, bands or buffers,
participation, workload) and the jax-privacy version: optimising BandMF for a
thousand rounds takes minutes, so each is saved as .npz under
the cache's strategies/ folder (default ~/.cache/fedjax-dp/strategies), written to a
temporary file and renamed (a crash never leaves a half-written strategy), and
read back by the next run with the same parameters (privacy/cache.py says where;
FEDJAX_DP_CACHE=off keeps none). Delete the folder to optimise afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import numpy as np

VERSION = 1   # of this cache's layout


def _path(kind: str, params: dict) -> str | None:
  import jax_privacy
  from fedjax_dp.privacy import cache
  root = cache.folder("strategies")
  if root is None:
    return None
  key = json.dumps({"kind": kind, "version": VERSION, "jax_privacy": jax_privacy.__version__,
                    **params}, sort_keys=True)
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  return os.path.join(root, f"{kind}-{digest}.npz")


def cached(kind: str, params: dict, compute) -> dict[str, np.ndarray]:
  """{name: array} of the strategy `kind` with `params`: read from the cache, or
  `compute()`d and saved there (atomically; FEDJAX_DP_CACHE=off: not kept)."""
  path = _path(kind, params)
  if path is None:
    return {k: np.asarray(v) for k, v in compute().items()}
  if os.path.exists(path):
    with np.load(path) as f:
      return {k: f[k] for k in f.files}
  arrays = {k: np.asarray(v) for k, v in compute().items()}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz.tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return arrays


def bandmf_params(rounds: int, bands: int, momentum: float, steps: int = 100,
                  lr_decay: float | None = None, rates=None) -> np.ndarray:
  """float32 [rounds, bands]: jax-privacy's BandMF strategy for `rounds` rounds,
  optimised for the mean squared error of the model's noise under momentum SGD's
  workload with the server's learning rates `rates` [rounds] (over server_lr: a
  cosine from 1 to `lr_decay`, training/server.cosine_factor, named by lr_decay in
  the cache; plain prefix sums at momentum 0 and a constant rate), from its default
  start."""
  def compute():
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import banded, streaming_matrix
    lrs = None if lr_decay is None else jnp.asarray(rates, jnp.float32)
    workload = (streaming_matrix.momentum_sgd_matrix(momentum, learning_rates=lrs)
                if momentum or lrs is not None else streaming_matrix.prefix_sum())
    if bands == 1:   # one band: nothing to optimise (independent noise)
      return {"params": np.ones((rounds, 1), np.float32)}
    c = banded.optimize(rounds, bands=bands, A=workload, max_optimizer_steps=steps)
    return {"params": np.asarray(jnp.asarray(c.params), np.float32)}
  params = {"rounds": rounds, "bands": bands, "momentum": momentum, "steps": steps}
  if lr_decay is not None:   # (absent for a constant rate: the cache's earlier entries hold)
    params["lr_decay"] = lr_decay
  return cached("bandmf", params, compute)["params"]


def blt_params(rounds: int, min_sep: int, max_participations: int,
               max_buffers: int = 6) -> tuple[np.ndarray, np.ndarray]:
  """(buf_decay, output_scale) float64: jax-privacy's BLT optimised for the mean
  squared error of `rounds` prefix sums under (min_sep, max_participations)."""
  def compute():
    import jax
    from jax_privacy.matrix_factorization import buffered_toeplitz
    with jax.enable_x64():
      blt = buffered_toeplitz.optimize(n=rounds, min_sep=min_sep,
                                       max_participations=max_participations, error="mean",
                                       max_buffers=max_buffers)
      return {"buf_decay": np.asarray(blt.buf_decay, np.float64),
              "output_scale": np.asarray(blt.output_scale, np.float64)}
  out = cached("blt", {"rounds": rounds, "min_sep": min_sep,
                       "max_participations": max_participations, "max_buffers": max_buffers},
               compute)
  return out["buf_decay"], out["output_scale"]
