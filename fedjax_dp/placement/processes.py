"""Many processes (hosts): the `clients` mesh axis over the devices of every process.

Every process runs the same program on the same config and data (SPMD, as
`jax.distributed` asks): it builds the same store, draws the same cohorts from
the same run key and runs the same compiled rounds, each on the slice of the
cohort its devices hold. The `clients` mesh spans all processes' devices
(`jax.devices()` is global once `start_processes` has run), so one process with 8 devices
and 4 processes with 2 each run one program. Cross-process reductions go through
XLA's collectives (gloo on CPU).

Only process 0 writes files (config, metrics, summary, plots, the released-round
marker); checkpoints are orbax's, written once, by all processes together
(each saves the shards it holds). `barrier` keeps a process from reading a run
folder while process 0 is still preparing it.
"""

from __future__ import annotations

import os

import numpy as np


def start_processes(num_processes: int | None = None, process_id: int | None = None,
                    coordinator: str | None = None) -> int:
  """Joins this process to a run of `num_processes`; returns the process count (1: alone).

  Arguments left None come from $JAX_NUM_PROCESSES, $JAX_PROCESS_ID and
  $JAX_COORDINATOR_ADDRESS (HOST:PORT of process 0's coordinator service). With
  neither a count above 1 nor those variables, does nothing. Must run before
  JAX's first device query, when JAX fixes its devices (as `host.use_cpu_devices`).
  Public as `fedjax_dp.start_processes`.
  """
  from fedjax_dp.errors import RunError
  num_processes = _setting(num_processes, "JAX_NUM_PROCESSES", "--num-processes")
  process_id = _setting(process_id, "JAX_PROCESS_ID", "--process-id")
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  if num_processes is None or num_processes == 1:
    if process_id not in (None, 0) or coordinator:
      raise RunError(f"--process-id {process_id} / --coordinator {coordinator}: these need "
                     "--num-processes 2 or more")
    return 1
  if num_processes < 1:
    raise RunError(f"--num-processes {num_processes}: expected 1 or more")
  if process_id is None or not 0 <= process_id < num_processes:
    raise RunError(f"--process-id {process_id}: with --num-processes {num_processes}, "
                   f"expected 0 to {num_processes - 1}")
  host, _, port = (coordinator or "").rpartition(":")
  if not host or not port.isdigit():
    raise RunError(f"--coordinator {coordinator!r}: expected HOST:PORT of process 0 "
                   "(for example 127.0.0.1:12355)")
  import jax
  if os.environ.get("JAX_PLATFORMS", "cpu").split(",")[0] in ("", "cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
  except RuntimeError as e:   # called twice, or after JAX started its backends
    raise RunError(f"start_processes: {str(e).splitlines()[0]}") from None
  return num_processes


def _setting(value: int | None, env: str, flag: str) -> int | None:
  if value is not None:
    return value
  raw = os.environ.get(env)
  if raw is None or raw == "":
    return None
  try:
    return int(raw)
  except ValueError:
    from fedjax_dp.errors import RunError
    raise RunError(f"${env}={raw!r} ({flag}): expected an integer") from None


def is_primary() -> bool:
  """True in the process that writes files (process 0; also a run of one process)."""
  import jax
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op alone)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def from_primary(value: np.ndarray) -> np.ndarray:
  """Process 0's `value` in every process (the value itself alone): for what a
  process draws on its own, as a secret run key from the system's entropy."""
  import jax
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.broadcast_one_to_all(value))


def host_value(a) -> np.ndarray:
  """A device array as a host array in every process: its own value where this
  process holds all of it (one process, or replicated), else gathered."""
  if getattr(a, "is_fully_addressable", True) or a.is_fully_replicated:
    return np.asarray(a)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(a, tiled=True))
