"""Test set-up (before JAX starts): 8 simulated CPU devices for the sharding
tests, and JAX's persistent compilation cache.

Many tests build the same small simulations, and the CLI tests start fresh
processes that compile the same round again; the cache compiles each program
once per worker. Each pytest-xdist worker gets its own directory, so no two
processes ever write one entry at once (JAX writes entries in place; an entry
it cannot read is recompiled, with a warning). The cache key is the compiled
program itself, so stale entries are never used for changed code.
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    ROOT, ".cache", "jax-tests", os.environ.get("PYTEST_XDIST_WORKER", "main")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
