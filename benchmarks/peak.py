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


def measure_matmul_peak(n: int | None = None, repeats: int = 7) -> dict:
  """Median GFLOP/s of an [n, n] @ [n, n] float32 matmul, with jit and with numpy.

  n defaults to 2048 on CPU and 8192 on an accelerator (2048 leaves a GPU mostly
  idle). The product is float32 (Precision.HIGHEST), as the simulation's are by
  default (config key matmul_precision); on a GPU also `jax_tf32_gflops`, the
  TF32 tensor cores' rate that JAX's own default (and 'tensorfloat32') runs at.
  """
  if n is None:
    n = 2048 if jax.default_backend() == "cpu" else 8192
  flops = 2.0 * n ** 3
  a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
  t_jax = _median_seconds(lambda: dot(ja, jb).block_until_ready(), repeats)
  t_np = _median_seconds(lambda: a @ b, repeats)
  jax_gflops, np_gflops = flops / t_jax / 1e9, flops / t_np / 1e9
  out = {"n": n, "backend": jax.default_backend(), "jax_gflops": round(jax_gflops, 1),
         "numpy_gflops": round(np_gflops, 1),
         "peak_gflops": round(max(jax_gflops, np_gflops), 1)}
  if jax.default_backend() != "cpu":   # what matmul_precision 'tensorfloat32' can reach
    tf32 = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGH))
    t = _median_seconds(lambda: tf32(ja, jb).block_until_ready(), repeats)
    out["jax_tf32_gflops"] = round(flops / t / 1e9, 1)
  return out


def measure_bandwidths(repeats: int = 7) -> dict:
  """Median GB/s (bytes read + written) of numpy copies: of 256 MiB (memory) and
  of 256 KiB copied 1,024 times (cache: a core's L2 holds it), one thread each."""
  out = {}
  for name, size, times in (("memory", 2 ** 28, 1), ("cache", 2 ** 18, 1024)):
    src = np.ones(size // 4, np.float32)
    dst = np.empty_like(src)

    def copy():
      for _ in range(times):
        np.copyto(dst, src)
    out[f"{name}_gbps"] = round(2 * size * times / _median_seconds(copy, repeats) / 1e9, 1)
  return out


if __name__ == "__main__":
  print(json.dumps(measure_matmul_peak(), indent=2))
