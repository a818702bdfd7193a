"""This machine's fp32 matmul throughput, the yardstick for achieved GFLOP/s.

  python benchmarks/peak.py      # prints JSON
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _median_seconds(fn, repeats):
  fn()  # warm-up (and compilation)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def measure_matmul_peak(n: int = 2048, repeats: int = 7) -> dict:
  """Median GFLOP/s of an [n, n] @ [n, n] float32 matmul, with jit and with numpy."""
  flops = 2.0 * n ** 3
  a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  dot = jax.jit(jnp.dot)
  t_jax = _median_seconds(lambda: dot(ja, jb).block_until_ready(), repeats)
  t_np = _median_seconds(lambda: a @ b, repeats)
  jax_gflops, np_gflops = flops / t_jax / 1e9, flops / t_np / 1e9
  return {"n": n, "jax_gflops": round(jax_gflops, 1), "numpy_gflops": round(np_gflops, 1),
          "peak_gflops": round(max(jax_gflops, np_gflops), 1)}


if __name__ == "__main__":
  print(json.dumps(measure_matmul_peak(), indent=2))
