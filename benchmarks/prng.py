"""Gaussian draws a second by PRNG implementation: what local DP's per-report noise
(local_noise_draw: client) costs, one N(0, 1) per coordinate per report.

  python benchmarks/prng.py [--millions 200] [--json OUT]

Times jax.random.normal of --millions float32 values (jitted, one device, median
of 5 after compilation) from keys of each implementation: threefry2x32 (JAX's
default, which the simulation uses), rbg and unsafe_rbg (XLA's RngBitGenerator).
threefry's bits are a function of the key and the shape alone, the same on every
backend, device count and sharding; rbg's and unsafe_rbg's may change with the
XLA version, the backend and how the array is sharded (JAX's docs), so the
simulation keeps threefry and draws local DP's noise once for the cohort's sum
where nothing reads a single report (the same distribution, d draws a round
instead of cohort x d).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp

from cli_args import new_file, write_results


def time_normal(impl: str, n: int, repeats: int = 5) -> float:
  """Median seconds of n float32 normals from a key of `impl`."""
  draw = jax.jit(lambda k: jax.random.normal(k, (n,), jnp.float32))
  key = jax.random.key(0, impl=impl)
  draw(key).block_until_ready()
  times = []
  for i in range(repeats):
    k = jax.random.fold_in(key, i)
    t = time.perf_counter()
    draw(k).block_until_ready()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--millions", type=int, default=200, help="normals a draw, in millions")
  ap.add_argument("--json", default=None, type=new_file)
  args = ap.parse_args(argv)
  n = args.millions * 10 ** 6
  out = {"backend": jax.default_backend(), "devices": jax.device_count(), "normals": n,
         "impls": {}}
  for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
    s = time_normal(impl, n)
    out["impls"][impl] = {"seconds": round(s, 4), "gnormals_per_s": round(n / s / 1e9, 3)}
  base = out["impls"]["threefry2x32"]["seconds"]
  for v in out["impls"].values():
    v["speedup_over_threefry"] = round(base / v["seconds"], 2)
  print(json.dumps(out, indent=2))
  if args.json:
    write_results(out, args.json)


if __name__ == "__main__":
  main()
