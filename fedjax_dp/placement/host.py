"""Host set-up that must happen before JAX starts: one XLA CPU device per core.

On a CPU, a round's local training is many small matmuls (a 64 x 784 batch
against a 784 x 200 layer). Splitting each one over all cores wastes most of
the time in synchronisation; giving each core its own device, and so its own
slice of the cohort, ran the core benchmark 1.3x faster on 2 cores
(BENCHMARKS.md). The cohort axis is sharded over those devices like over GPUs.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"


def use_cpu_devices(count: int | None = None) -> int | None:
  """Asks XLA for `count` CPU devices (default: $FEDJAX_DP_CPU_DEVICES, else the core count).

  Does nothing when XLA_FLAGS already sets a device count or the count is 0 or
  1. XLA reads the flag when its backends start (the first device query), so
  this is a no-op once JAX has run anything. Returns the count set, or None.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if _FLAG in flags:
    return None
  if count is None:
    env = os.environ.get("FEDJAX_DP_CPU_DEVICES")
    count = int(env) if env else (os.cpu_count() or 1)
  if count <= 1:
    return None
  os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={count}".strip()
  return count
