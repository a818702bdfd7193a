"""Every kernel in kernels/ against its plain reference, at several sizes (issue 21 item 10).

  python benchmarks/kernels.py [--sizes small,medium,large] [--repeats 7] [--json PATH]

For each kernel and size, each variant's median seconds over --repeats calls
(after a warm-up that compiles it; jitted, block_until_ready), its speed against
the plain numpy reference (kernels/reference.py, float64) timed the same way,
and its agreement with that reference checked in the same run:

  l2_clip             flat clipping of a 3-leaf update: l2_clip_reference (concatenated)
                      and l2_clip (leaf by leaf)
  per_part_clip       per-layer clipping of the same update
  topk_mask           k = d / 10: exact (lax.top_k), approx (lax.approx_max_k),
                      threshold (sampled), bisect (the round's default); agreement
                      = recall of the reference's top k, and the count kept
  gaussian_noise      flat (one draw split) and leafwise (the round's); agreement =
                      the sample std against the asked one (other streams than numpy's)
  contrastive         TopkSDP-FL's bounded term: value and gradient with the custom
                      VJP (the round's) and by plain autodiff
  weighted_mean       [m, d] over m clients: broadcast-and-sum and tensordot (the round's)
  robust rules        [m, d]: coordinate median, trimmed mean (0.1), Krum (f = m/10),
                      Multi-Krum, outlier-switched median, clustered mean,
                      centred clipping (3 steps), geometric median (4 Weiszfeld steps),
                      gradient filtering (filtered mean: cosine 0, z 3.5)

Sizes: d (parameters) 2e4 / 2e5 / 2e6 ('small' / 'medium' / 'large'; the FMNIST
MLP has 2e5); the client-axis kernels (weighted mean, robust rules) take m x d =
10 x 2e4, 100 x 2e5 and 1000 x 2e4 (a cross-device cohort). Run on CPU by
default; on a GPU machine JAX's default backend is timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from fedjax_dp.placement.host import use_cpu_devices_or_exit  # noqa: E402

use_cpu_devices_or_exit()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cli_args import new_file, positive_int, write_results  # noqa: E402
from fedjax_dp.algorithms.contrastive import bounded_push  # noqa: E402
from fedjax_dp.algorithms.base import sq_dist  # noqa: E402
from fedjax_dp.kernels import clipping, gaussian_noise, reference, topk  # noqa: E402
from fedjax_dp.kernels import robust_aggregation as ra  # noqa: E402
from fedjax_dp.kernels import weighted_mean  # noqa: E402
from fedjax_dp.robust.centered_clip import centered_clipping  # noqa: E402
from fedjax_dp.robust.geometric_median import weiszfeld  # noqa: E402

DIMS = {"small": 20_000, "medium": 200_000, "large": 2_000_000}
CLIENTS = {"small": (10, 20_000), "medium": (100, 200_000), "large": (1000, 20_000)}


def median_seconds(fn, repeats: int) -> float:
  jax.block_until_ready(fn())   # warm-up: compiles
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def max_rel_error(got, want) -> float:
  got = np.concatenate([np.ravel(np.asarray(g, np.float64)) for g in jax.tree.leaves(got)])
  want = np.concatenate([np.ravel(np.asarray(w, np.float64)) for w in jax.tree.leaves(want)])
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def update_tree(d: int, seed: int = 0):
  """A 3-layer update of d parameters (90 %, 9 %, 1 %), as numpy float32 leaves."""
  rng = np.random.default_rng(seed)
  sizes = [int(d * 0.9), int(d * 0.09)]
  sizes.append(d - sum(sizes))
  return [rng.normal(size=(s // 10, 10) if s >= 10 else (s, 1)).astype(np.float32)
          for s in sizes]


# --------------------------------------------------------------------------- the cases
# each returns {variant: (fn() -> output, check(output) -> (ok, agreement))} and the
# reference's fn; `check` compares with the reference's output


def clip_cases(d):
  leaves = update_tree(d)
  dev = [jnp.asarray(x) for x in leaves]
  c = 0.5 * float(np.sqrt(sum(np.sum(np.square(x)) for x in leaves)))
  want = reference.l2_clip(leaves, c)
  ok = lambda out: (lambda e: (e < 1e-5, e))(max_rel_error(out, want))
  ref = jax.jit(lambda t: clipping.l2_clip_reference(t, c)[0])
  fast = jax.jit(lambda t: clipping.l2_clip(t, c)[0])
  return {"reference (numpy)": lambda: reference.l2_clip(leaves, c),
          "l2_clip_reference": (lambda: ref(dev), ok), "l2_clip": (lambda: fast(dev), ok)}


def part_clip_cases(d):
  leaves = update_tree(d)
  dev = [jnp.asarray(x) for x in leaves]
  parts = (0, 1, 2)
  bounds = np.array([0.5 * float(np.linalg.norm(x)) for x in leaves], np.float32)
  want = reference.per_part_clip(leaves, parts, bounds)
  fn = jax.jit(lambda t: clipping.per_part_clip(t, parts, jnp.asarray(bounds))[0])
  return {"reference (numpy)": lambda: reference.per_part_clip(leaves, parts, bounds),
          "per_part_clip": (lambda: fn(dev),
                            lambda out: (lambda e: (e < 1e-5, e))(max_rel_error(out, want)))}


def topk_cases(d):
  x = np.random.default_rng(1).normal(size=d).astype(np.float32)
  k = d // 10
  want = reference.topk_mask(x, k)
  xd = jnp.asarray(x)
  key = jax.random.PRNGKey(1)

  def recall(out, need):
    out = np.asarray(out)
    r = float(np.sum(out & want) / k)
    return r >= need and abs(int(out.sum()) - k) <= 0.01 * k + 1, round(r, 4)
  variants = {
      "exact (lax.top_k)": (jax.jit(lambda v: topk.topk_mask_exact(v, k)), 1.0),
      "approx (approx_max_k)": (jax.jit(lambda v: topk.topk_mask_approx(v, k)), 0.9),
      "threshold (sampled)": (jax.jit(lambda v: topk.topk_mask_threshold(v, k, key)), 0.9),
      "bisect": (jax.jit(lambda v: topk.topk_mask_bisect(v, k, key)), 0.99)}
  cases = {"reference (numpy)": lambda: reference.topk_mask(x, k)}
  for name, (fn, need) in variants.items():
    cases[name] = (functools.partial(fn, xd), functools.partial(recall, need=need))
  return cases


def noise_cases(d):
  dev = [jnp.asarray(x) for x in update_tree(d)]
  key = jax.random.PRNGKey(2)
  rng = np.random.default_rng(2)
  std = 0.7

  def sample_std(out):
    s = float(np.std(np.concatenate([np.ravel(np.asarray(o)) for o in out])))
    return abs(s / std - 1) < 5 * np.sqrt(0.5 / d) + 1e-3, round(s, 5)
  flat = jax.jit(lambda t: gaussian_noise.gaussian_noise_reference(t, key, std))
  leafwise = jax.jit(lambda t: gaussian_noise.gaussian_noise_leafwise(t, key, std))
  return {"reference (numpy)": lambda: [std * rng.standard_normal(x.shape) for x in dev],
          "gaussian_noise_reference (flat)": (lambda: flat(dev), sample_std),
          "gaussian_noise_leafwise": (lambda: leafwise(dev), sample_std)}


def contrastive_cases(d):
  rng = np.random.default_rng(3)
  p, g, prev = (rng.normal(size=d).astype(np.float32) for _ in range(3))
  mu1, mu2 = 0.1, 0.05
  r2 = 0.8 * float(np.sum((p - prev) ** 2))    # inside the radius: the push is live
  want = reference.bounded_contrastive(p, g, prev, mu1, mu2, r2)
  ok = lambda out: (lambda e: (e < 1e-4, e))(max_rel_error(out, want))

  def ours(w):
    return 0.5 * mu1 * sq_dist(w, g) + mu2 * bounded_push(w, prev, r2)

  def plain(w):
    return 0.5 * mu1 * jnp.sum((w - g) ** 2) - 0.5 * mu2 * jnp.minimum(
        jnp.sum((w - prev) ** 2), r2)
  vg_ours, vg_plain = jax.jit(jax.value_and_grad(ours)), jax.jit(jax.value_and_grad(plain))
  pd = jnp.asarray(p)
  return {"reference (numpy)": lambda: reference.bounded_contrastive(p, g, prev, mu1, mu2, r2),
          "custom VJP (the round's)": (lambda: vg_ours(pd), ok),
          "plain autodiff": (lambda: vg_plain(pd), ok)}


def weighted_mean_cases(m, d):
  rng = np.random.default_rng(4)
  a = rng.normal(size=(m, d)).astype(np.float32)
  w = rng.uniform(1, 5, size=m).astype(np.float32)
  want = reference.weighted_sum(w, a)
  ok = lambda out: (lambda e: (e < 1e-5, e))(max_rel_error(out, want))
  ad, wd = jnp.asarray(a), jnp.asarray(w)
  ref = jax.jit(weighted_mean.weighted_sum_reference)
  fast = jax.jit(weighted_mean.weighted_sum_tensordot)
  return {"reference (numpy)": lambda: reference.weighted_sum(w, a),
          "weighted_sum_reference": (lambda: ref(wd, ad), ok),
          "weighted_sum_tensordot": (lambda: fast(wd, ad), ok)}


def robust_cases(m, d):
  """Each robust rule on m clients (one far upload) against its numpy reference."""
  rng = np.random.default_rng(5)
  centers = rng.normal(size=(3, d)).astype(np.float32)
  u = centers[rng.integers(0, 3, m)] + 0.3 * rng.normal(size=(m, d)).astype(np.float32)
  u[0] *= 20.0
  w = rng.uniform(1, 5, size=m).astype(np.float32)
  mask = np.ones(m, bool)
  ud, md, wd = jnp.asarray(u), jnp.asarray(mask), jnp.asarray(w)
  f = max(m // 10, 1)
  zero = np.zeros(d, np.float32)
  # (the rule of (u, mask, w), its numpy reference, tolerance); the arrays are the jitted
  # function's arguments (closed over, XLA would fold the whole rule at compile time)
  rules = {
      "coordinate_median": (lambda u, m_, w_: ra.coordinate_median(u, m_),
                            lambda: reference.coordinate_median(u), 1e-5),
      "trimmed_mean (0.1)": (lambda u, m_, w_: ra.trimmed_mean(u, m_, beta=0.1),
                             lambda: reference.trimmed_mean(u, 0.1), 1e-5),
      "krum (f = m/10)": (lambda u, m_, w_: ra.krum(u, m_, f=f),
                        lambda: reference.krum(u, f), 1e-5),
      "multi_krum (f = m/10, m/2 kept)": (lambda u, m_, w_: ra.krum(u, m_, f=f, m_keep=m // 2),
                                          lambda: reference.krum(u, f, m // 2), 1e-5),
      "outlier median (z 3.5)": (lambda u, m_, w_: ra.median_if_outliers(u, m_, w_)[0],
                                 lambda: reference.median_if_outliers(u, w, 3.5), 1e-5),
      "filtered mean (cos 0, z 3.5)": (lambda u, m_, w_: ra.filtered_mean(u, m_, w_, 0.0, 3.5)[0],
                                       lambda: reference.filtered_mean(u, w, 0.0, 3.5)[0], 1e-5),
      "clustered mean (cos > 0.5)": (lambda u, m_, w_: ra.clustered_mean(u, m_, w_, 0.5)[0],
                                     lambda: reference.clustered_mean(u, w, 0.5)[0], 1e-4),
      "centered clip (3 steps)": (
          lambda u, m_, w_: centered_clipping(u, m_, jnp.zeros(u.shape[1]), 1.0, 3)[0],
          lambda: reference.centered_clip(u, zero, 1.0, 3)[0], 1e-4),
      "geometric median (4 steps)": (lambda u, m_, w_: weiszfeld(u, m_, w_, 4, 1e-6),
                                     lambda: reference.weiszfeld(u, w, 4, 1e-6), 1e-4)}
  out = {}
  for name, (rule, ref, tol) in rules.items():
    want = ref()
    fn = jax.jit(rule)
    out[name] = {"reference (numpy)": ref,
                 "jax": (lambda fn=fn: fn(ud, md, wd),
                         lambda o, want=want, tol=tol: (lambda e: (e < tol, e))(
                             max_rel_error(o, want)))}
  return out


def kernel_cases(size: str) -> dict:
  """{kernel: cases} at one size."""
  d = DIMS[size]
  m, dm = CLIENTS[size]
  cases = {"l2_clip": clip_cases(d), "per_part_clip": part_clip_cases(d),
           "topk_mask (k = d/10)": topk_cases(d), "gaussian_noise": noise_cases(d),
           "contrastive (bounded)": contrastive_cases(d),
           "weighted_mean": weighted_mean_cases(m, dm)}
  cases.update({f"robust: {k}": v for k, v in robust_cases(m, dm).items()})
  return cases


def run(sizes: list[str], repeats: int, log=print) -> list[dict]:
  rows = []
  for size in sizes:
    for kernel, cases in kernel_cases(size).items():
      ref_fn = cases.pop("reference (numpy)")
      ref_s = median_seconds(ref_fn, repeats)
      shape = (f"m={CLIENTS[size][0]}, d={CLIENTS[size][1]:.0e}"
               if kernel.startswith(("robust", "weighted")) else f"d={DIMS[size]:.0e}")
      for variant, (fn, check) in cases.items():
        seconds = median_seconds(fn, repeats)
        ok, agreement = check(fn())
        rows.append({"kernel": kernel, "size": size, "shape": shape, "variant": variant,
                     "seconds": seconds, "reference_s": ref_s,
                     "speedup_over_reference": ref_s / seconds, "agrees": bool(ok),
                     "agreement": agreement})
        log(f"{kernel:34s} {shape:18s} {variant:32s} {seconds * 1e3:9.3f} ms  "
            f"x{ref_s / seconds:7.1f} vs numpy  {'ok' if ok else 'DISAGREES'} ({agreement})")
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--sizes", default="small,medium,large",
                 help="comma-separated: small, medium, large")
  p.add_argument("--repeats", type=positive_int, default=7)
  p.add_argument("--json", type=new_file, help="write the results here (a new file)")
  args = p.parse_args(argv)
  sizes = [s for s in args.sizes.split(",") if s]
  bad = [s for s in sizes if s not in DIMS]
  if bad or not sizes:
    p.error(f"--sizes {args.sizes!r}: allowed are small, medium, large (comma-separated)")
  from peak import measure_matmul_peak
  result = {"machine": {"cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count(), "backend": jax.default_backend(),
                        "devices": [str(d) for d in jax.devices()]},
            "peak": measure_matmul_peak(), "rows": run(sizes, args.repeats)}
  result["all_agree"] = all(r["agrees"] for r in result["rows"])
  if args.json:
    write_results(result, args.json)
  print(json.dumps({"peak": result["peak"], "all_agree": result["all_agree"]}))
  return 0 if result["all_agree"] else 1


if __name__ == "__main__":
  sys.exit(main())
