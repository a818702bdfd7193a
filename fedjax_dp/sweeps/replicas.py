"""Replicas: runs that share one compiled program, run together.

Runs whose configs differ only in numbers (hyperparameters as data, recipes/hparams.py)
and seeds share a compiled round: a sweep builds one Simulation and derives each
run's with `with_seed` and `with_hparams`. `run_batch` then runs them in groups
of `replica_batch`:

  1        one after the other, each through the ordinary run loop on the shared
           compiled program: every run is bit for bit what `fedjax-dp run` of
           its config computes, and only the first compiles;
  n > 1    n runs stacked on a leading [replicas] axis and `vmap`ped inside ONE
           compiled chunk (Simulation.run_replicas): their states and numbers
           are separate, nothing is shared but the program; batched matmuls
           round apart from a single run (about 1e-7 relative).

`auto` is 1 on CPU, where the vmapped program measured slower than running the
replicas one after the other (BENCHMARKS.md, Sweeps: a client's local training
is a loop whose length is its example count; vmapped over replicas whose cohorts
differ, it runs to the longest with selects), and all the program's replicas up
to AUTO_ACCELERATOR on an accelerator, where one replica leaves the chip idle.

Every run keeps its own callbacks (files, evaluation, budget stop, divergence),
called at its own chunk ends exactly as run_loop calls them; a run that stops
early (budget, divergence) stops its callbacks, while its replica's slot keeps
computing until the batch ends (its results are not read).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from fedjax_dp.experiment.loop import (Callback, RunContext, after_chunk, chunk_ends, end_run,
                                      run_loop, start_run)
from fedjax_dp.experiment import interrupts

AUTO_ACCELERATOR = 32   # replicas vmapped together by default on a GPU or TPU


def replica_batch_size(setting, platform: str, paged: bool) -> int:
  """The replicas run together: `setting` (an int, or 'auto': see the module docstring)."""
  if paged:
    return 1   # a host table is paged round by round for one run
  if setting == "auto":
    return 1 if platform == "cpu" else AUTO_ACCELERATOR
  return int(setting)


def run_batch(ctxs: list[RunContext], callbacks: list[list[Callback]], size: int) -> None:
  """Runs `ctxs` (sharing one compiled program and start round) in groups of `size`."""
  for i in range(0, len(ctxs), size):
    group, cbs = ctxs[i:i + size], callbacks[i:i + size]
    if len(group) == 1:
      run_loop(group[0], cbs[0])
    else:
      run_replicas(group, cbs)


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _take(tree, i: int):
  return jax.tree.map(lambda a: a[i], tree)


def run_replicas(ctxs: list[RunContext], callbacks: list[list[Callback]]) -> None:
  """Runs the contexts as replicas of one vmapped program (see the module docstring):
  chunks end at every context's chunk ends; each context's callbacks see its own
  state and the RoundStats of the rounds since its last chunk end."""
  sim, start = ctxs[0].sim, ctxs[0].start
  if any(c.start != start or c.sim.run_chunk is not sim.run_chunk for c in ctxs):
    raise ValueError("run_replicas: the runs must share a compiled program and a start round")
  for ctx, cbs in zip(ctxs, callbacks):
    start_run(ctx, cbs)
  ends = [chunk_ends(start, ctx.cfg, ctx.last) for ctx in ctxs]
  states = _stack([ctx.state for ctx in ctxs])
  hparams = _stack([ctx.sim.hparams for ctx in ctxs])
  active = list(range(len(ctxs)))
  pending: list = [None] * len(ctxs)   # stats and seconds since a run's last chunk end
  at = start
  for end in sorted(set().union(*ends)):
    t = time.perf_counter()
    states, stats = sim.run_replicas(states, hparams, end - at)
    stats.loss_sum.block_until_ready()
    # each replica's share of the batch's time (summary.json's seconds per round)
    seconds, at = (time.perf_counter() - t) / len(ctxs), end
    for i in list(active):
      mine = _take(stats, i)
      if pending[i] is not None:
        before, s = pending[i]
        mine, seconds_i = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), before, mine), s
      else:
        seconds_i = 0.0
      pending[i] = (mine, seconds_i + seconds)
      if end not in ends[i]:
        continue
      stats_i, seconds_i = pending[i]
      pending[i] = None
      stop = after_chunk(ctxs[i], callbacks[i], _take(states, i), stats_i, end, seconds_i)
      if stop or end == ctxs[i].last:
        end_run(ctxs[i], callbacks[i])
        active.remove(i)
    interrupts.check()
    if not active:
      break
  for i in active:   # a run resumed at its last round has no chunk to run: it ends here
    end_run(ctxs[i], callbacks[i])
