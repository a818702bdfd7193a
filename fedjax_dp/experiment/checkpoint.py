"""Orbax checkpoints of the whole simulation state, plus host-side run metadata.

Orbax writes each step into a temporary folder and renames it when complete,
so a process killed mid-save never leaves a half-written checkpoint listed as
the newest. A checkpoint that is listed but unreadable (disk damage, a file
truncated by hand) is reported and the previous one is used. So is one that
reads but whose state no longer matches the SHA-256 digest saved with it
(bytes changed in place: orbax itself would restore them silently).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedjax_dp.errors import CheckpointError  # noqa: F401  (its old home)
from fedjax_dp.placement import processes

# orbax logs every save at INFO through absl; keep the user's terminal for the progress bar
logging.getLogger("absl").setLevel(logging.WARNING)


def _manager(directory: str, keep: int = 3) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
      item_names=("state", "meta"))


DIGEST_KEY = "state_sha256"


def state_digest(state: Any) -> str:
  """SHA-256 over every leaf's dtype, shape and bytes, in tree order (a leaf
  sharded over many processes is gathered: every process computes the same digest)."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(state):
    a = np.ascontiguousarray(processes.host_value(leaf))
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.reshape(-1).view(np.uint8))   # the buffer itself: tobytes() would copy the leaf
  return h.hexdigest()


SIDE = "side"   # a step's folder of files beside orbax's items (a host client table)


def save(directory: str, step: int, state: Any, meta: dict, keep: int = 3,
         side: Callable[[str], None] | None = None) -> None:
  """Saves `state` (a pytree of arrays) and JSON `meta` as checkpoint `step`; blocks until done.

  side(folder): writes what the pytree does not hold (a HostTable's rows) into
  `folder`, which it makes. It is written first, beside the steps, and moved into
  the step's folder once orbax has finished that step; a step killed in between
  lacks it, and restore_latest then falls back to the step before."""
  meta = {**meta, DIGEST_KEY: state_digest(state)}
  pending = os.path.join(os.path.abspath(directory), f".{SIDE}-{step}.tmp")
  if side is not None:
    shutil.rmtree(pending, ignore_errors=True)   # left by a killed save
    side(pending)
  absl = logging.getLogger("absl")
  level = absl.level
  # orbax logs a traceback at ERROR when Ctrl-C lands in its wait; the interrupt
  # itself still propagates, and a failed save still raises
  absl.setLevel(logging.CRITICAL)
  interrupted = False
  try:
    with _manager(directory, keep) as mgr:
      # steps from `step` on are what a resume fell back past (unreadable) and re-ran:
      # orbax would skip this save while a step >= it is listed
      for stale in [s for s in mgr.all_steps() if s >= step]:
        mgr.delete(stale)
      mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             meta=ocp.args.JsonSave(meta)))
      mgr.wait_until_finished()
  except KeyboardInterrupt:
    # orbax's threads go on failing as the interrupted manager shuts down, and log
    # tracebacks at ERROR after this returns (seen in CI, before 'interrupted'): the
    # run is ending, so absl stays quiet
    interrupted = True
    raise
  finally:
    if not interrupted:
      absl.setLevel(level)
  if side is not None:
    os.replace(pending, os.path.join(os.path.abspath(directory), str(step), SIDE))


def steps(directory: str) -> list[int]:
  if not os.path.isdir(directory):
    return []
  with _manager(directory) as mgr:
    return sorted(mgr.all_steps())


def restore_latest(directory: str, template: Any, warn=None,
                   side: Callable[[str, Any], Any] | None = None) -> tuple[int, Any, dict]:
  """Restores the newest readable checkpoint as (step, state, meta).

  `template` is a state pytree with the right structure, shapes, dtypes and
  shardings. A checkpoint that fails to restore is reported through `warn`
  (default: stderr) and the next older one is tried. side(folder, state) -> state
  reads what save's `side` wrote (an error there also falls back).
  """
  warn = warn or (lambda msg: print(msg, file=sys.stderr))
  available = steps(directory)
  if not available:
    raise CheckpointError(f"no checkpoint found in {directory}")
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
  layouts = False   # a checkpoint whose state has another pytree layout than `template`
  with _manager(directory) as mgr:
    for step in reversed(available):
      try:
        restored = mgr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        meta = dict(restored["meta"])
        saved = meta.pop(DIGEST_KEY, None)   # absent in checkpoints from before the digest
        if saved is not None and saved != state_digest(restored["state"]):
          raise ValueError("its state does not match the digest saved with it")
        state = restored["state"]
        if side is not None:
          state = side(os.path.join(os.path.abspath(directory), str(step), SIDE), state)
        return step, state, meta
      except Exception as e:  # orbax raises many types for damaged files
        # the first line, without the storage layer's internals after a colon
        reason = str(e).splitlines()[0].split(": {")[0][:160] if str(e) else type(e).__name__
        if "tree structures do not match" in str(e):
          layouts = True
          reason = ("its state's layout is not this run's: a checkpoint of another "
                    "configuration, or written by another fedjax-dp version")
        warn(f"warning: checkpoint at round {step} in {directory} is unreadable ({reason}); "
             "trying the previous one")
  raise CheckpointError(f"no readable checkpoint in {directory} (tried rounds {available})"
                        + ("; a checkpoint's layout differs from this version's: resume it "
                           "with the fedjax-dp that wrote it" if layouts else ""))
