"""TopkSDP-FL round time against FedAvg, and top-k kernel variants (issue 4, item 7).

Part 1, protocol: the core benchmark's (full Fashion-MNIST, 100 clients, all 100
every round, Dirichlet 0.5, MLP 784-200-200-10, E = 1, batch 64, lr 0.01,
momentum 0.5). Two compiled simulations in one process: FedAvg, and TopkSDP-FL
(contrastive term, top-k with error feedback at s_local = 0.9, noise on the
kept coordinates at the paper's calibration, layer-wise shuffling, downlink
top-k at s_global = 0.9), once per top-k kernel: 'exact' with the noise drawn
per client (the literal algorithm), 'threshold', and 'bisect' with the noise
of the aggregate drawn once (same distribution; pipeline.gaussian_on_kept).
Compiled chunks of 5 rounds (the CLI's default chunk: it ends one at each
evaluation) are timed alternately, A B C D A B C D ..., and the medians of the
seconds per round are compared, as is the median of the per-cycle ratios
(each cycle times FedAvg next to every variant). The per-client state stays
in the rounds' working layout between chunks, as in `fedjax-dp run`.
Target: TopkSDP at most 25 % slower.
Ablations (`--ablations`) time each part alone against FedAvg in the same way.
`--control` adds a second FedAvg to the alternation: its ratio to the first
(1.00x on a steady machine) says how far the machine's noise alone moves a ratio.

Part 2: top-k masks of d = 1e5, 2e5, 1e6, 1e7 Gaussian values at k = d / 10:
lax.top_k, lax.approx_max_k, the sampled-quantile threshold and the bisecting
threshold. Reports the median time of 5, the count kept and the recall
against the exact top-k.

  python benchmarks/topksdp_round.py [--chunks 7] [--chunk-rounds 5] [--dataset fmnist]
      [--ablations] [--no-kernels] [--only VARIANT ...] [--control] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from fedjax_dp.placement.host import use_cpu_devices_or_exit

use_cpu_devices_or_exit()

import jax
import numpy as np

from cli_args import new_file, write_results, positive_int
from fedjax_dp import make_config
from fedjax_dp.kernels import topk as topk_kernels
from fedjax_dp.experiment.setup import setup

PROTOCOL = dict(num_clients=100, clients_per_round=100, partition="dirichlet", alpha=0.5,
                model="mlp", hidden=[200, 200], local_epochs=1, batch_size=64, lr=0.01,
                momentum=0.5, sampling="fixed", seed=0)
TOPKSDP = dict(algorithm="topksdp", coordinate_clip=0.05, kept_noise="paper", ldp_epsilon=3.0)


VARIANTS = [("fedavg", {}),
            ("topksdp", dict(TOPKSDP, kept_noise_draw="client")),
            ("topksdp_threshold", dict(TOPKSDP, topk_kernel="threshold", kept_noise_draw="client")),
            ("topksdp_bisect", dict(TOPKSDP, topk_kernel="bisect"))]
# A/A control (`--control`): a second, separately compiled FedAvg timed in the same
# alternation; its ratio to FedAvg is what the machine's noise alone reads
CONTROL = ("fedavg_again", {})
# each part of the bisect variant alone (s_local/s_global 0 turn off the preset's top-k)
ABLATIONS = [("fedavg", {}),
             ("contrastive_only", dict(algorithm="contrastive")),
             ("topk_ef_only", dict(s_local=0.9, topk_kernel="bisect")),
             ("topk_ef_noise", dict(s_local=0.9, topk_kernel="bisect", coordinate_clip=0.05,
                                    kept_noise="paper", ldp_epsilon=3.0)),
             ("shuffle_only", dict(shuffle="layerwise")),
             ("downlink_only", dict(s_global=0.9, topk_kernel="bisect"))]


def round_times(dataset: str, chunks: int, chunk_rounds: int, variants=VARIANTS) -> dict:
  """Seconds per round: the median over `chunks` compiled chunks of `chunk_rounds`
  rounds each (the CLI runs chunks that end at each evaluation, every 5 rounds
  by default), the variants' chunks alternated."""
  sims = {}
  for name, extra in variants:
    _, _, sim = setup(make_config(dict(PROTOCOL, dataset=dataset, **extra)))
    # in the rounds' own layout from chunk to chunk, as `fedjax-dp run` keeps it
    state, _ = sim.run_working(sim.to_working(sim.init_state()), chunk_rounds)   # compile
    jax.block_until_ready(state)
    sims[name] = [sim, state]
  times = {name: [] for name in sims}
  for _ in range(chunks):
    for name, entry in sims.items():
      t = time.perf_counter()
      entry[1], _ = entry[0].run_working(entry[1], chunk_rounds)
      jax.block_until_ready(entry[1])
      times[name].append((time.perf_counter() - t) / chunk_rounds)
  med = {name: statistics.median(ts) for name, ts in times.items()}
  # each cycle times FedAvg and then every variant: the median of the per-cycle
  # ratios follows the machine's drift better than the ratio of the medians
  paired = {name: statistics.median(t / f for t, f in zip(ts, times["fedavg"]))
            for name, ts in times.items() if name != "fedavg"}
  return {"seconds_per_round_median": med, "all": times, "chunk_rounds": chunk_rounds,
          "over_fedavg": {name: med[name] / med["fedavg"] for name in med if name != "fedavg"},
          "over_fedavg_paired": paired, "target_ratio": 1.25}


def topk_variants(sizes=(10**5, 2 * 10**5, 10**6, 10**7), repeats=5) -> list[dict]:
  out = []
  for d in sizes:
    k = d // 10
    x = jax.random.normal(jax.random.PRNGKey(0), (d,))
    exact = np.asarray(topk_kernels.topk_mask_exact(x, k))
    fns = {
        "lax.top_k": jax.jit(lambda v: topk_kernels.topk_mask_exact(v, k)),
        "lax.approx_max_k": jax.jit(lambda v: topk_kernels.topk_mask_approx(v, k)),
        "sampled_threshold": jax.jit(lambda v: topk_kernels.topk_mask_threshold(
            v, k, jax.random.PRNGKey(1))),
        "bisect": jax.jit(lambda v: topk_kernels.topk_mask_bisect(v, k, jax.random.PRNGKey(1))),
    }
    for name, fn in fns.items():
      mask = jax.block_until_ready(fn(x))
      ts = []
      for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(x))
        ts.append(time.perf_counter() - t)
      m = np.asarray(mask)
      out.append({"d": d, "k": k, "variant": name, "seconds_median": statistics.median(ts),
                  "kept": int(m.sum()), "recall": float((m & exact).sum() / k)})
  return out


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--chunks", type=positive_int, default=7, help="timed chunks per variant")
  ap.add_argument("--chunk-rounds", type=positive_int, default=5,
                  help="rounds per compiled chunk")
  ap.add_argument("--ablations", action="store_true")
  ap.add_argument("--no-kernels", action="store_true")
  ap.add_argument("--dataset", default="fmnist")
  ap.add_argument("--only", nargs="+", default=None, metavar="VARIANT",
                  choices=[name for name, _ in VARIANTS if name != "fedavg"],
                  help="time FedAvg and only these variants of part 1 (more chunks in the "
                       "same time), e.g. --only topksdp_bisect")
  ap.add_argument("--control", action="store_true",
                  help="also time a second FedAvg (A/A): its ratio to FedAvg is the noise floor")
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  args = ap.parse_args(argv)
  variants = [v for v in VARIANTS if args.only is None or v[0] == "fedavg" or v[0] in args.only]
  res = {"protocol": dict(PROTOCOL, dataset=args.dataset), "topksdp": TOPKSDP,
         "devices": jax.device_count(), "platform": jax.devices()[0].platform,
         "rounds": round_times(args.dataset, args.chunks, args.chunk_rounds,
                               variants + [CONTROL] * args.control)}
  if args.ablations:
    res["ablations"] = round_times(args.dataset, args.chunks, args.chunk_rounds, ABLATIONS)
  if not args.no_kernels:
    res["topk_kernels"] = topk_variants()
  print(json.dumps(res, indent=2))
  if args.json:
    write_results(res, args.json)


if __name__ == "__main__":
  main()
