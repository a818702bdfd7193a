"""The run loop: the Callback protocol, the run's context, and the loop that calls
each callback around the compiled chunks of rounds (callbacks.py: the protocol's
description and the default callbacks)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from fedjax_dp.experiment import interrupts
from fedjax_dp.experiment.reports import privacy_log
from fedjax_dp.config import Config
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.losses import Task
from fedjax_dp.core.simulation import Simulation


class Callback(NamedTuple):
  """Three optional hooks; see experiment/callbacks.py's docstring."""
  on_run_start: Callable[["RunContext"], None] | None = None
  after_chunk: Callable[["RunContext", Any], bool | None] | None = None
  on_run_end: Callable[["RunContext"], None] | None = None


def chunk_ends(start: int, cfg: Config, last: int | None = None) -> list[int]:
  """Round numbers at which a compiled chunk ends, after `start`, up to `last` (default: rounds)."""
  last = cfg.rounds if last is None else last
  ends = set(range(cfg.eval_every, last + 1, cfg.eval_every)) | {last}
  if cfg.checkpoint_every:
    ends |= set(range(cfg.checkpoint_every, last + 1, cfg.checkpoint_every))
  return sorted(e for e in ends if start < e <= last)


def check_callbacks(callbacks) -> list[Callback]:
  """The user's callbacks as a list, or a one-line ConfigError naming the first
  that is not a Callback (before anything is loaded or written)."""
  from fedjax_dp.errors import ConfigError
  callbacks = list(callbacks)
  for i, cb in enumerate(callbacks):
    if not isinstance(cb, Callback):
      raise ConfigError(f"callbacks[{i}] is a {type(cb).__name__}: allowed are "
                        "callbacks.Callback(on_run_start=, after_chunk=, on_run_end=)")
  return callbacks


# diagnostics summed between evaluations, saved in every checkpoint: their values at round 0
# ("stages": {'<stage>.<metric>': sum} of the stages' own metrics, RoundStats.metrics
# beyond those read as its attributes)
DIAGNOSTICS = {"loss_sum": 0.0, "examples": 0.0, "unclipped": 0.0, "clip_seen": 0.0,
               "flagged": 0.0, "clusters": 0.0, "agg_rounds": 0, "nonfinite": 0,
               "bounded": 0.0, "stages": {}}


def fresh_diagnostics(saved: dict | None = None) -> dict:
  """DIAGNOSTICS (or a checkpoint's `saved` values of them), with a dict of its own
  for the stages' sums."""
  saved = saved or {}
  out = {k: saved.get(k, v) for k, v in DIAGNOSTICS.items()}
  out["stages"] = dict(out["stages"])
  return out


@dataclasses.dataclass
class RunContext:
  """What the loop and the callbacks share (the loop and the defaults update it)."""
  cfg: Config
  out: str
  sim: Simulation
  ds: Dataset
  parts: list[np.ndarray]
  task: Task
  log: Callable[[str], None]
  state: Any                 # SimState: the rounds' working layout inside the loop
                             # (client_order(ctx) gives client order), client order at the end
  start: int                 # the round this run starts from (a resume's restored round)
  last: int                  # the last round the privacy budget allows (<= cfg.rounds)
  plog: dict | None          # the privacy log (None: resumed from a checkpoint without one)
  calibration: float | None  # central DP's calibrated noise multiplier, else None
  meta: dict                 # the restored checkpoint's host meta (resume.FRESH_META at 0)
  rows: list[dict]           # metrics.jsonl's rows so far
  setup_s: float
  num_params: int
  comm: dict                 # pipeline.communication: bytes per participant and round
  inputs: dict | None = None # your own data, model, loss (inputs_fingerprint.py), else None
  progress: bool = True      # show the progress bar
  round: int = 0             # rounds done
  prev_round: int = 0        # rounds done before this chunk
  round_by_round: bool = False  # chunks of one round: set in on_run_start by a callback
                             # that reads every round's model (the audit's all-iterates)
  wall0: float = 0.0         # perf_counter() at round 0, less a resumed run's wall time
  chunk_times: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  diag: dict = dataclasses.field(default_factory=dict)
  stop: bool = False         # a callback ended the run (after this chunk)
  budget_stopped: bool = False
  test_metrics: dict | None = None   # this chunk's evaluation {metric: value}
  attack_metrics: dict | None = None # a data attack's success on its test set (poisoning.py)
  row: dict | None = None            # this chunk's metrics.jsonl row
  last_checkpoint: int = 0
  summary: dict | None = None
  ordered: Any = None        # this chunk's state in client order, once asked for
  diverged: dict | None = None   # where the run stopped being finite (divergence.report)
  warnings: list[str] = dataclasses.field(default_factory=list)   # also in summary.json
  test_mode: str | None = None   # why the charged epsilon is no guarantee (the audit's
                                 # --undercharge): summary.json and the rows then give none


def client_order(ctx: RunContext):
  """The state with its per-client rows in client order (one copy per chunk, if asked)."""
  if ctx.ordered is None:
    ctx.ordered = ctx.sim.to_client_order(ctx.state)
  return ctx.ordered


def eval_due(ctx: RunContext) -> bool:
  return ctx.round % ctx.cfg.eval_every == 0 or ctx.round == ctx.last or ctx.stop


def checkpoint_due(ctx: RunContext) -> bool:
  every = ctx.cfg.checkpoint_every
  return bool(every) and (ctx.round % every == 0 or ctx.round == ctx.last or ctx.stop)


def unfinished(ctx: RunContext, done: int) -> bool:
  """At the run's end: rounds ran after `done` (a run a callback stopped between
  evaluation or checkpoint rounds)."""
  return ctx.start < ctx.round and done < ctx.round


def run_loop(ctx: RunContext, callbacks: list[Callback]) -> dict | None:
  """Runs ctx's rounds from ctx.start to ctx.last in chunks, calling the callbacks;
  returns ctx.summary."""
  start_run(ctx, callbacks)
  ends = chunk_ends(ctx.start, ctx.cfg, ctx.last)
  if ctx.round_by_round:
    ends = list(range(ctx.start + 1, ctx.last + 1))
  for end in ends:
    t = time.perf_counter()
    state, stats = ctx.sim.run_working(ctx.state, end - ctx.round)
    stats.loss_sum.block_until_ready()
    if after_chunk(ctx, callbacks, state, stats, end, time.perf_counter() - t):
      break
  return end_run(ctx, callbacks)


def start_run(ctx: RunContext, callbacks: list[Callback]) -> None:
  """The loop's start: on_run_start, then the state in the rounds' working layout
  (the per-client state is put in client order only where it is read: client_order)."""
  ctx.round = ctx.prev_round = ctx.last_checkpoint = ctx.start
  ctx.wall0 = time.perf_counter() - ctx.meta["wall_s"]
  for cb in callbacks:
    if cb.on_run_start is not None:
      cb.on_run_start(ctx)
  interrupts.check()   # before the first chunk compiles
  ctx.state = ctx.sim.to_working(ctx.state)


def after_chunk(ctx: RunContext, callbacks: list[Callback], state, stats, end: int,
                seconds: float) -> bool:
  """The loop after a chunk that took the run to round `end` (state in the working
  layout, its RoundStats, the chunk's seconds): the privacy log, then after_chunk
  of every callback. True: the run ends here (a callback stopped it)."""
  ctx.state = state
  if ctx.plog is not None:
    ctx.plog = privacy_log.append(ctx.plog, stats, ctx.sim.privacy.event_multipliers)
  ctx.chunk_times.append((end - ctx.round, seconds))
  ctx.prev_round, ctx.round = ctx.round, end
  ctx.ordered = ctx.test_metrics = ctx.row = None
  for cb in callbacks:
    if cb.after_chunk is not None and cb.after_chunk(ctx, stats):
      ctx.stop = True   # the callbacks after it see it (evaluate, checkpoint)
  # the client-order copy (checkpoints, SOLO evaluation) is replicated on every device:
  # freed here, not kept beside the working table through the next chunk
  ctx.ordered = None
  interrupts.check()   # a Ctrl-C some library swallowed ends the run here
  return ctx.stop


def end_run(ctx: RunContext, callbacks: list[Callback]) -> dict | None:
  """The loop's end: the state in client order, on_run_end; returns ctx.summary."""
  ctx.state = ctx.ordered = ctx.sim.to_client_order(ctx.state)
  for cb in callbacks:
    if cb.on_run_end is not None:
      cb.on_run_end(ctx)
  return ctx.summary
