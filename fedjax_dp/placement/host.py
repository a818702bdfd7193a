"""Host set-up that must happen before JAX starts: one XLA CPU device per core.

On a CPU, a round's local training is many small matmuls (a 64 x 784 batch
against a 784 x 200 layer). Splitting each one over all cores wastes most of
the time in synchronisation; giving each core its own device, and so its own
slice of the cohort, ran the core benchmark 1.3x faster on 2 cores
(BENCHMARKS.md). The cohort axis is sharded over those devices like over GPUs.
"""

import os
import re
import sys

_FLAG = "--xla_force_host_platform_device_count"
_ENV = "FEDJAX_DP_CPU_DEVICES"


def use_cpu_devices(count: int | None = None) -> int | None:
  """Asks XLA for `count` CPU devices (default: $FEDJAX_DP_CPU_DEVICES, else the core count).

  Does nothing when XLA_FLAGS already sets a device count or the count is 0 or
  1. XLA reads the flag when its backends start (the first device query), so
  this is a no-op once JAX has run anything. Returns the count set, or None.

  Raises ValueError when $FEDJAX_DP_CPU_DEVICES is not a whole number >= 1, or
  asks for another count than XLA_FLAGS sets: XLA's flag would win, and the
  variable be silently ignored (a test's one-device subprocess once ran on 8
  devices, each holding a copy of the per-client table, and was killed).
  """
  flags = os.environ.get("XLA_FLAGS", "")
  env = os.environ.get(_ENV)
  requested = _parse_count(env) if env else None
  counts = re.findall(rf"{_FLAG}=(\S*)", flags)
  if counts:
    if requested is not None and counts[-1] != str(requested):
      raise ValueError(
          f"{_ENV}={env} asks for {requested} CPU device(s), but XLA_FLAGS sets "
          f"{_FLAG}={counts[-1]}, which would win: unset one or make them agree")
    return None
  if count is None:
    count = requested if requested is not None else (os.cpu_count() or 1)
  if count <= 1:
    return None
  os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={count}".strip()
  return count


def _parse_count(text: str) -> int:
  if not text.strip().isdigit() or int(text) < 1:
    raise ValueError(f"{_ENV}={text!r} is not a device count: give a whole number >= 1")
  return int(text)


def use_cpu_devices_or_exit() -> int | None:
  """use_cpu_devices() for a command's entry point: a bad request is one line
  `error: ...` on stderr and exit status 2, as the command line's other user errors."""
  try:
    return use_cpu_devices()
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
