"""The run loop as callbacks: what happens between compiled chunks of rounds.

`runner.run_experiment` runs the rounds in compiled chunks (ending at every
multiple of `eval_every` and `checkpoint_every`) and, around them, calls each
callback of a list in order:

  on_run_start(ctx)              once, before the first chunk
  after_chunk(ctx, stats) -> bool after every chunk; True ends the run after this chunk
  on_run_end(ctx)                once, after the last chunk (ctx.state in client order)

`stats` are the chunk's RoundStats (simulation.py; leaves [rounds in the
chunk], on the device). The defaults, in this order, write what `fedjax-dp run`
writes:

  budget_stop   ends the run when the privacy budget is spent (and says so)
  finite_model  ends the run once the global model is not finite (-> ctx.diverged)
  evaluate      the task's test metrics at evaluation rounds -> ctx.test_metrics
  metrics       diagnostics since the last evaluation; a metrics.jsonl row -> ctx.row
  divergence    ends the run at non-finite test metrics; warns once of a tenfold loss
  checkpoint    orbax checkpoints every checkpoint_every rounds and at the end
  progress      the progress bar
  final_model   model.msgpack: the trained parameters (not after a divergence)
  summary       summary.json (with the privacy report) -> ctx.summary
  plots         PNG curves -> ctx.summary["plots"]

Your callbacks come after them, so they see this chunk's ctx.test_metrics and
ctx.row (None where the chunk did not evaluate) and, at the end, ctx.summary.
A run you stop early is evaluated and checkpointed at the round it stopped
(checkpoint_every > 0), and summary.json does not call it a budget stop. A run
that diverged is evaluated where it stopped but not checkpointed there: its
non-finite state would push out the good checkpoints before it.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.experiment import checkpoint as ckpt
from fedjax_dp.experiment import divergence as div
from fedjax_dp.experiment import reporting
from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.experiment.metrics_row import (aggregator_metrics, expected_cohorts_only,
                                              published_participations, spent_epsilon)
from fedjax_dp.experiment.resume import mark_released
from fedjax_dp.placement import paged_state
from fedjax_dp.experiment.setup import client_label_distribution
from fedjax_dp.experiment.summary import run_summary
from fedjax_dp.experiment.reports.local_dp_report import clients_spent
from fedjax_dp.experiment.reports.privacy_report import rounds_skipped
from fedjax_dp.experiment.loop import (  # noqa: F401  (the protocol, public here)
    DIAGNOSTICS, Callback, RunContext, after_chunk, check_callbacks, checkpoint_due,
    chunk_ends, client_order, end_run, eval_due, fresh_diagnostics, run_loop, start_run,
    unfinished)
from fedjax_dp.core.state import ATTRIBUTE_METRICS
from fedjax_dp.experiment import noise_note


# ---------------------------------------------------------------------------- the defaults


def budget_stop() -> Callback:
  """Ends the run when no round can release anything more within the budget."""
  def start(ctx: RunContext) -> None:
    if ctx.last < ctx.cfg.rounds:
      ctx.log(f"privacy budget: the run stops after round {ctx.last} of {ctx.cfg.rounds}; one "
              f"more round would pass target_epsilon {ctx.cfg.target_epsilon:g}")

  def after(ctx: RunContext, stats) -> bool:
    cfg, sim = ctx.cfg, ctx.sim
    # local DP: once every client's budget is spent, no round can change the model
    spent = (bool(np.all(clients_spent(sim, ctx.state)))
             if get_mechanism(cfg.dp).per_client_ledgers else False)
    if spent:
      ctx.log(f"privacy budget: every client has spent target_epsilon {cfg.target_epsilon:g}; "
              f"the run stops after round {ctx.round}")
    if sim.privacy.stop_in_round and int(np.sum(stats.spent)) > 0:
      spent = True
      ctx.log(f"privacy budget: one more round would pass target_epsilon "
              f"{cfg.target_epsilon:g}; the run stops at round "
              f"{int(ctx.state.round) - int(np.sum(stats.spent))} (rounds after it were skipped)")
    ctx.budget_stopped |= spent
    return spent
  return Callback(on_run_start=start, after_chunk=after)


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def finite_model() -> Callback:
  """Ends the run after a chunk that left the global model non-finite (one device
  reduction a chunk); the evaluation and row that follow show where. SOLO has no
  global model: its test metrics tell (divergence)."""
  def after(ctx: RunContext, stats) -> bool:
    if "solo" in parse_algorithm(ctx.cfg.algorithm)[0] or bool(_all_finite(ctx.state.params)):
      return False
    bad = np.flatnonzero(~np.isfinite(np.asarray(stats.loss_sum)))
    what = f"the global model is not finite after round {ctx.round}" + (
        f" (the training loss was first not finite at round {ctx.prev_round + 1 + bad[0]})"
        if bad.size else "")
    ctx.diverged = div.report(ctx.round, what, ctx.rows)
    return True
  return Callback(after_chunk=after)


def divergence() -> Callback:
  """Ends the run at an evaluation whose test metrics are not finite; warns once
  (ctx.log, summary.json's warnings) when the loss grows tenfold, and once when
  the training loss is not finite while the model stays finite."""
  warned, initial = set(), []

  def start(ctx: RunContext) -> None:
    # the untrained model's test loss: a loss absurd from the first evaluation is growth too
    if ctx.start == 0 and "solo" not in parse_algorithm(ctx.cfg.algorithm)[0]:
      initial.append(float(ctx.sim.evaluate(ctx.state.params, *ctx.sim.test_data)["loss"]))

  def warn(ctx: RunContext, kind: str, text: str) -> None:
    if kind not in warned:
      warned.add(kind)
      ctx.warnings.append(text)
      ctx.log(f"warning: {text}")

  def after(ctx: RunContext, stats) -> bool:
    row = ctx.row
    if row is None:
      return False
    if ctx.diverged is None and not div.row_is_finite(row):
      keys = [k for k in row["nonfinite"] if k.startswith("test_")]
      ctx.diverged = div.report(ctx.round, f"{', '.join(keys)} not finite", ctx.rows[:-1])
      return True
    if ctx.diverged is None and "train_loss" in row.get("nonfinite", ()):
      warn(ctx, "train", f"the training loss was not finite before round {row['round']} while "
           "the global model stayed finite: a client's local training diverged (under DP "
           "or a robust rule its upload is dropped)")
    growth = div.loss_growth(ctx.rows, initial[0] if initial else None, div.advice(
        noise_note.mean_update_ratio(ctx.cfg, ctx.sim.noise_multiplier,
                                     ctx.sim.privacy.strategy)))
    if growth:
      warn(ctx, "growth", growth)
    return False
  return Callback(on_run_start=start, after_chunk=after)


def evaluate() -> Callback:
  """The task's test metrics at every evaluation round -> ctx.test_metrics. SOLO:
  the mean over clients of each client's own model on the reweighted test set."""
  solo = {}

  def start(ctx: RunContext) -> None:
    if "solo" in parse_algorithm(ctx.cfg.algorithm)[0]:
      from fedjax_dp.core.evaluate import make_solo_evaluate
      solo["eval"] = make_solo_evaluate(ctx.sim.model, ctx.sim.cfg.matmul_precision)
      solo["dist"] = client_label_distribution(ctx.ds, ctx.parts)

  def measure(ctx: RunContext) -> None:
    if solo:
      models = client_order(ctx).client_state["model"]
      acc, loss = (float(v) for v in solo["eval"](models, *ctx.sim.test_data, solo["dist"]))
      ctx.test_metrics = {"accuracy": acc, "loss": loss}
    else:
      values = ctx.sim.evaluate(ctx.state.params, *ctx.sim.test_data)
      # in the task's order (a jitted dict comes back with its keys sorted)
      ctx.test_metrics = {k: float(values[k]) for k in ctx.task.metrics}
    if ctx.sim.attack_data is not None:   # the share put in the attacker's target class
      name, batches = ctx.sim.attack_data
      ctx.attack_metrics = {name: float(ctx.sim.evaluate(ctx.state.params, *batches)[
          "accuracy"])}

  def after(ctx: RunContext, stats) -> None:
    if eval_due(ctx):
      measure(ctx)

  def end(ctx: RunContext) -> None:
    if unfinished(ctx, ctx.rows[-1]["round"] if ctx.rows else 0):
      measure(ctx)
  return Callback(on_run_start=start, after_chunk=after, on_run_end=end)


def metrics() -> Callback:
  """Sums the chunk's diagnostics; where the chunk evaluated, writes the metrics.jsonl
  row (test metrics, train loss, epsilon spent, bytes, ...) -> ctx.row, ctx.rows."""
  def start(ctx: RunContext) -> None:
    ctx.diag = fresh_diagnostics(ctx.meta)

  def after(ctx: RunContext, stats) -> None:
    d = ctx.diag
    d["nonfinite"] += int(np.sum(stats.nonfinite))
    d["loss_sum"] += float(np.sum(stats.loss_sum))  # one host transfer per chunk
    d["examples"] += float(np.sum(stats.examples))
    d["unclipped"] += float(np.sum(stats.unclipped))
    # the fraction's denominator: the expected cohort of each released round where
    # the realised Poisson cohort sizes are private (metrics_row.expected_cohorts_only)
    d["clip_seen"] += (ctx.cfg.clients_per_round * float(np.sum(np.asarray(stats.event) >= 0))
                       if expected_cohorts_only(ctx.cfg) else float(np.sum(stats.participants)))
    d["flagged"] += float(np.sum(stats.flagged))
    d["bounded"] += float(np.sum(stats.bounded))
    d["clusters"] += float(np.sum(stats.clusters))
    d["agg_rounds"] += ctx.round - ctx.prev_round
    for stage, figures in stats.metrics.items():
      for name, value in figures.items():
        if (stage, name) not in ATTRIBUTE_METRICS:
          key = f"{stage}.{name}"
          d["stages"][key] = d["stages"].get(key, 0.0) + float(np.sum(value))
    if ctx.test_metrics is not None:
      write_row(ctx)

  def end(ctx: RunContext) -> None:
    if ctx.test_metrics is not None and unfinished(ctx, ctx.rows[-1]["round"] if ctx.rows
                                                  else 0):
      write_row(ctx)
  return Callback(on_run_start=start, after_chunk=after, on_run_end=end)


def write_row(ctx: RunContext) -> None:
  """Appends this round's metrics.jsonl row and starts the diagnostics afresh."""
  cfg, sim, state, d = ctx.cfg, ctx.sim, ctx.state, ctx.diag
  participations = published_participations(cfg, state)
  row = {"round": ctx.round, **{f"test_{k}": v for k, v in ctx.test_metrics.items()},
         **(ctx.attack_metrics or {}),
         "train_loss": d["loss_sum"] / d["examples"] if d["examples"] else None,
         **spent_epsilon(sim, state, ctx.plog, ctx.test_mode),   # the working layout
         **({"clip_norm": float(state.privacy.clip_norm),
             "unclipped_fraction": d["unclipped"] / d["clip_seen"] if d["clip_seen"] else None,
             "nonfinite_uploads": int(d["nonfinite"])}
            if get_mechanism(cfg.dp).private else {}),
         **aggregator_metrics(cfg, d["flagged"], d["clusters"], d["agg_rounds"], d["bounded"]),
         "bytes_up": participations * ctx.comm["bytes_per_client_up"],
         "bytes_down": participations * ctx.comm["bytes_per_client_down"],
         **d["stages"],   # the stages' own metrics, summed over the row's rounds
         "wall_s": round(time.perf_counter() - ctx.wall0, 4)}
  row = div.finite_row(row)   # JSON has no NaN: null, and the key listed under 'nonfinite'
  reporting.append_metrics(os.path.join(ctx.out, "metrics.jsonl"), row)
  mark_released(ctx.out, ctx.round)
  ctx.rows.append(row)
  ctx.row = row
  ctx.diag = fresh_diagnostics()


def checkpoint() -> Callback:
  """Saves the state (client order) and the host meta every checkpoint_every rounds,
  at the last round, and where the run stops."""
  def save(ctx: RunContext) -> None:
    calibrating = (get_mechanism(ctx.cfg.dp).calibrates_to_target
                   and ctx.cfg.noise_multiplier is None)
    state = client_order(ctx)
    ckpt.save(os.path.join(ctx.out, "checkpoints"), ctx.round, state,
              {"wall_s": time.perf_counter() - ctx.wall0, **ctx.diag, "privacy_log": ctx.plog,
               **({"calibration": {"rounds": ctx.cfg.rounds,
                                   "noise_multiplier": ctx.calibration}}
                  if calibrating else {})},
              keep=ctx.cfg.keep_checkpoints, side=paged_state.checkpoint_side(state)[0])
    mark_released(ctx.out, ctx.round)
    ctx.last_checkpoint = ctx.round

  def after(ctx: RunContext, stats) -> None:
    if checkpoint_due(ctx) and ctx.diverged is None:
      save(ctx)

  def end(ctx: RunContext) -> None:
    if ctx.cfg.checkpoint_every and unfinished(ctx, ctx.last_checkpoint) and \
        ctx.diverged is None:
      save(ctx)
  return Callback(after_chunk=after, on_run_end=end)


def progress() -> Callback:
  """A tqdm bar on stderr (ctx.progress False: none), with the first test metric."""
  bar = []

  def start(ctx: RunContext) -> None:
    from tqdm import tqdm
    bar.append(tqdm(total=ctx.cfg.rounds, initial=ctx.start, unit="round",
                    disable=not ctx.progress, file=sys.stderr, dynamic_ncols=True,
                    desc="compiling", smoothing=0))   # rate: the mean since compilation

  def after(ctx: RunContext, stats) -> None:
    b, done = bar[0], ctx.round - ctx.prev_round
    if not b.disable and b.desc:   # compiled: the rate and ETA count the rounds after it
      b.set_description_str("", refresh=False)
      b.initial, b.start_t = b.n + done, b._time()
    b.update(done)
    if ctx.test_metrics is not None:
      name, value = next(iter(ctx.test_metrics.items()))
      bar[0].set_postfix({"acc" if name == "accuracy" else name: f"{value:.4f}"})

  def end(ctx: RunContext) -> None:
    bar[0].close()
  return Callback(on_run_start=start, after_chunk=after, on_run_end=end)


def final_model() -> Callback:
  """Saves the trained parameters to model.msgpack (experiment/final_model.py)."""
  def end(ctx: RunContext) -> None:
    if ctx.diverged is not None:
      return   # non-finite parameters: the checkpoints before it are the last good ones
    from fedjax_dp.experiment import final_model as fm
    if "solo" in parse_algorithm(ctx.cfg.algorithm)[0]:
      fm.save(ctx.out, ctx.state.client_state["model"], key="client_models")
    else:
      fm.save(ctx.out, ctx.state.params)
  return Callback(on_run_end=end)


def summary() -> Callback:
  """Writes summary.json (final metrics, privacy report, communication, timing)."""
  def end(ctx: RunContext) -> None:
    skipped = rounds_skipped(ctx.cfg, ctx.state)
    # the run ended before `rounds`: a budget stopped it (the last round, or a skip),
    # unless one of your callbacks did
    stopped = (int(ctx.state.round) - skipped < ctx.cfg.rounds
               and not (ctx.stop and not ctx.budget_stopped))   # a divergence is no budget stop
    if get_mechanism(ctx.cfg.dp).per_client_ledgers:   # the per-client list beside it,
      from fedjax_dp.experiment.reports import local_dp_report as ldp   # before the summary
      rows = ldp.client_epsilon_rows(ctx.sim, ctx.state)                  # lists the files
      if ctx.test_mode is not None:   # the charged figures are no guarantee: none given
        rows = [dict(r, epsilon=None) for r in rows]
      reporting.write_text_atomic(os.path.join(ctx.out, ldp.CLIENT_EPSILONS),
                                  reporting.csv_text(rows))
    ctx.summary = run_summary(ctx, stopped)
    reporting.write_json_atomic(os.path.join(ctx.out, "summary.json"), ctx.summary)
  return Callback(on_run_end=end)


def plot_title(ctx: RunContext) -> str:
  """'mine: fedavg on digits, 20 clients (10 a round); central DP z 1.2, q 0.5': what a
  plot shows, beyond the folder's name (the first-hour review, finding 9)."""
  cfg, m = ctx.cfg, get_mechanism(ctx.cfg.dp)
  title = (f"{os.path.basename(os.path.abspath(ctx.out))}: {cfg.algorithm} on {cfg.dataset}, "
           f"{cfg.num_clients:,} clients ({cfg.clients_per_round:,} a round)")
  if m.private:
    z = ctx.sim.noise_multiplier
    title += (f"; {cfg.dp} DP z {z:.3g}, q {cfg.clients_per_round / cfg.num_clients:.3g}")
  return title


def plots() -> Callback:
  """PNG curves of metrics.jsonl; their paths go to ctx.summary['plots']."""
  def end(ctx: RunContext) -> None:
    cfg = ctx.cfg
    mechanism = get_mechanism(cfg.dp)
    paths = reporting.plot_metrics(
        ctx.rows, ctx.out, title=plot_title(ctx),
        target_epsilon=cfg.target_epsilon if mechanism.private else None,
        epsilon_is="the largest client's" if mechanism.per_client_ledgers else None)
    if ctx.summary is not None:
      ctx.summary["plots"] = paths
  return Callback(on_run_end=end)


def log_metrics(*writers) -> Callback:
  """Hands every metrics.jsonl row to each writer (experiment/writers.py: csv,
  tensorboard, or your own MetricsWriter) as it is written; a resumed run's kept
  rows first. Put it in `callbacks=` (the CLI: `fedjax-dp run --log csv tensorboard`)."""
  seen = [0]

  def start(ctx: RunContext) -> None:
    for w in writers:
      w.start(list(ctx.rows))
    seen[0] = len(ctx.rows)

  def flush(ctx: RunContext) -> None:
    for row in ctx.rows[seen[0]:]:
      for w in writers:
        w.write(row)
    seen[0] = len(ctx.rows)

  def end(ctx: RunContext) -> None:
    flush(ctx)   # a row the run's end wrote (a run stopped between evaluations)
    for w in writers:
      w.close()
  return Callback(on_run_start=start, after_chunk=lambda ctx, stats: flush(ctx),
                  on_run_end=end)


def defaults() -> list[Callback]:
  """What `fedjax-dp run` writes, in order."""
  return [budget_stop(), finite_model(), evaluate(), metrics(), divergence(), checkpoint(),
          progress(), final_model(), summary(), plots()]
