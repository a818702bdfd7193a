"""The accountant's share of round time at 100 clients (issue 3, target below 1 %).

Protocol: the core benchmark's (full Fashion-MNIST, 100 clients, all 100 every
round, MLP 784-200-200-10, E = 1, batch 64) with local DP and a target epsilon,
the heaviest accounting path: every round gathers the cohort's 100 ledgers
[100, orders], composes the event, converts each to epsilon to decide who may
take part, and scatters them back. In one invocation it measures
  * seconds per round of the whole compiled round (median of 5 after compilation),
  * the same ledger work alone, compiled, as a `lax.scan` of 1,000 rounds
    (median of 5), and its share of the round,
  * the host-side costs outside the round: the event's RDP curve at set-up
    (Poisson and fixed-size), and the per-evaluation conversion of 100 ledgers.

  python benchmarks/accountant_share.py [--dataset fmnist] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cli_args import new_file, write_results

from fedjax_dp.placement.host import use_cpu_devices_or_exit

use_cpu_devices_or_exit()

import jax
import jax.numpy as jnp

from fedjax_dp.privacy import accounting
from fedjax_dp import make_config
from fedjax_dp.experiment.setup import setup

PROTOCOL = dict(num_clients=100, clients_per_round=100, partition="dirichlet", alpha=0.5,
                model="mlp", hidden=[200, 200], local_epochs=1, batch_size=64, lr=0.01,
                momentum=0.5, sampling="fixed", seed=0, dp="local", noise_multiplier=10.0,
                target_epsilon=1000.0, clip_norm=1.0)


def median_of(fn, repeats=5):
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times), times


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--dataset", default="fmnist")
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  args = ap.parse_args(argv)
  cfg = make_config(dict(PROTOCOL, dataset=args.dataset))
  _, _, sim = setup(cfg)
  state = sim.init_state()
  state, _ = sim.run_rounds(state, 1)  # compile
  holder = {"state": state}

  def one_round():
    holder["state"], _ = sim.run_rounds(holder["state"], 1)
    return holder["state"]
  round_s, round_times = median_of(one_round)

  # the ledger work of the round, alone: [num_clients, orders] ledgers, a cohort of 100
  event = jnp.asarray(sim.privacy.event_rdp, jnp.float32)
  delta, target = cfg.delta, cfg.target_epsilon
  n, m = cfg.num_clients, cfg.clients_per_round

  @jax.jit
  def ledger_rounds(ledgers, ids, mask):
    def step(ledgers, _):
      after = accounting.compose(ledgers[ids], event)
      within = accounting.epsilon(after, delta)[0] <= target
      take = mask & within
      return ledgers.at[ids].add(take[:, None] * event), jnp.sum(take)
    return jax.lax.scan(step, ledgers, None, length=1000)

  ledgers = accounting.init_ledger(shape=(n,))
  ids = jnp.arange(m, dtype=jnp.int32)
  mask = jnp.ones(m, bool)
  jax.block_until_ready(ledger_rounds(ledgers, ids, mask))
  ledger_1000_s, _ = median_of(lambda: ledger_rounds(ledgers, ids, mask))
  ledger_s = ledger_1000_s / 1000

  def fresh_poisson_curve():   # computed, not the per-process memo's answer
    accounting._poisson_gaussian_rdp.cache_clear()
    return accounting.poisson_gaussian_rdp(0.1, 1.0)
  host_poisson_s, _ = median_of(fresh_poisson_curve)
  accounting._log_likelihood_ratio_moments.cache_clear()
  t = time.perf_counter()
  accounting.fixed_size_gaussian_rdp(100, 1000, 0.5)
  host_fixed_s = time.perf_counter() - t
  host_eval_s, _ = median_of(lambda: sim.epsilons(holder["state"]))

  out = {
      "protocol": dict(PROTOCOL, dataset=args.dataset),
      "devices": jax.device_count(), "platform": jax.devices()[0].platform,
      "round_s_median": round_s, "round_s_all": round_times,
      "ledger_work_per_round_s": ledger_s,
      "ledger_share_of_round": ledger_s / round_s,
      "target_share": 0.01,
      "host": {"poisson_event_rdp_s": host_poisson_s,
               "fixed_size_event_rdp_s_uncached": host_fixed_s,
               "epsilons_of_100_ledgers_s": host_eval_s,
               "note": "the event curve is computed once per run; the conversion once per "
                       "evaluation, outside the compiled rounds"},
  }
  print(json.dumps(out, indent=2))
  if args.json:
    write_results(out, args.json)


if __name__ == "__main__":
  main()
