"""Test set-up (before JAX starts): 8 simulated CPU devices for the sharding
tests, LLVM optimization level 0, and JAX's persistent compilation cache.

Many tests build the same small simulations, and the CLI tests start fresh
processes that compile the same round again; the cache compiles each program
once for all of them. The pytest-xdist workers share one directory
(.cache/jax-tests/main: $PYTEST_XDIST_WORKER is not yet set when this file is
imported), so one worker reuses what the other compiled. JAX writes an entry in
place, without a lock; one read while another process is writing it fails to
load, and JAX then compiles the program again with a warning, so the race costs
time, never a result. The cache key is the compiled program itself, so stale
entries are never used for changed code.
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 8 CPU devices through XLA_FLAGS; a FEDJAX_DP_CPU_DEVICES of the caller's own would
# disagree with it (host.py refuses that), so it is dropped
os.environ.pop("FEDJAX_DP_CPU_DEVICES", None)
# LLVM's optimization level 0 for the compiled tests: XLA's own passes (fusion,
# layout, sharding) still run and no float semantics change (no fast-math at any
# level), but a cold compile of the suite is about a quarter shorter (124 -> 95 s
# for three test files), which keeps `make test` on a fresh CI clone, where every
# program compiles, within its 10 minutes. Benchmarks and runs compile at the default.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the tests' own references in float32 on a GPU too (JAX's GPU default is TF32, whose
# 1e-3 errors would fail comparisons the simulation itself passes: test_precision.py)
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    ROOT, ".cache", "jax-tests", os.environ.get("PYTEST_XDIST_WORKER", "main")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The analyzer's trained semantic network (privacy/tiers/semantic_cache.py): kept in the
# project's .cache, not the user's home, and shared by the workers like the programs.
os.environ.setdefault("FEDJAX_DP_CACHE", os.path.join(ROOT, ".cache", "fedjax-dp-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# On an accelerator (JAX_PLATFORMS=cuda, benchmarks/gpu_check.sh) there is one
# device, not 8 simulated ones: a test whose mesh asks for more is reported as
# skipped, naming the count, instead of failing. On CPU the 8 devices always
# exist, so there the same error still fails the test.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if call.excinfo is None or not report.failed:
    return
  message = str(call.excinfo.value)
  if message.startswith("config key 'devices' = ") and "this machine has" in message:
    import jax
    if jax.default_backend() != "cpu":
      report.outcome = "skipped"
      report.longrepr = (str(item.path), item.location[1] or 0,
                         f"Skipped: more devices than this {jax.default_backend()} machine "
                         f"has ({message})")


def _listed_slow_cases() -> frozenset[str]:
  """The node ids of tests/slow_cases.txt (fast cases measured at 10 s or more)."""
  with open(os.path.join(ROOT, "tests", "slow_cases.txt")) as f:
    return frozenset(line.split("#")[0].strip() for line in f
                     if line.strip() and not line.startswith("#"))


SLOW_CASES = _listed_slow_cases()


# before -m selects (addopts' "not slow"): the listed cases are slow tests like the
# decorated ones
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.nodeid in SLOW_CASES:
      item.add_marker(pytest.mark.slow)
