"""summary.json: a run's final figures, privacy report, communication, timing, data and devices."""

from __future__ import annotations

import statistics

import numpy as np

from fedjax_dp import losses
from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.config import Config
from fedjax_dp.experiment.metrics_row import published_participations
from fedjax_dp.experiment import reporting
from fedjax_dp.experiment import releases
from fedjax_dp.experiment.reports.privacy_report import mark_test_mode, privacy_report, report_facts


def run_summary(ctx, stopped: bool | None = None) -> dict:
  """summary.json of a run (callbacks.RunContext) at its end; `stopped`: a budget
  ended it before `rounds`. Under a guarantee its privacy report's not_accounted
  lists every output the run folder holds (with this summary and the plots about to
  be drawn) that the guarantee does not cover (experiment/releases.py)."""
  summary = _summary(ctx, stopped)
  if "not_accounted" in summary["privacy"]:
    written = releases.run_outputs(ctx.out, ctx.rows, summary,
                                   plots=[p[0] for p in reporting.plot_panels(ctx.rows)])
    summary["privacy"]["not_accounted"] = releases.not_accounted(
        ctx.cfg, written, report_facts(ctx.cfg, ctx.state))
  return summary


def _summary(ctx, stopped: bool | None) -> dict:
  cfg, ds, sim, state, rows = ctx.cfg, ctx.ds, ctx.sim, ctx.state, ctx.rows
  sizes = [len(p) for p in ctx.parts]
  times = ctx.chunk_times
  per_round = [t / n for n, t in times[1:]] or [t / n for n, t in times]
  final = rows[-1] if rows else {}
  return {
      "final": final,
      **_test_summary(cfg, ctx.task, rows),
      "rounds": int(state.round),
      "diverged": ctx.diverged,   # None, or where the model stopped being finite
      "warnings": list(ctx.warnings),
      "privacy": mark_test_mode(privacy_report(cfg, sim, state, ctx.plog, assume=False,
                                               stopped_by_budget=stopped), ctx.test_mode),
      "communication": {
          "bytes_up": final.get("bytes_up", 0), "bytes_down": final.get("bytes_down", 0),
          **ctx.comm,
          "note": "bytes as they would be sent: float32 values, plus int32 indices or a d-bit "
                  "bitmap for a sparse update, whichever is smaller, plus SCAFFOLD's dense "
                  "control variates (SOLO sends nothing); the down link counts one round's "
                  "broadcast per participant (not the updates a returning client missed)",
          "participations": published_participations(cfg, state),
          "num_params": ctx.num_params,
      },
      "timing": {
          "wall_s": final.get("wall_s"), "setup_s": round(ctx.setup_s, 3),
          "first_chunk_s": round(times[0][1], 3) if times else None,
          "seconds_per_round_median": statistics.median(per_round) if per_round else None,
      },
      "model": {"name": sim.model.name, "params": ctx.num_params},
      "data": {"dataset": cfg.dataset, **({"name": ds.name} if cfg.dataset == "custom" else {}),
               "source": ds.source,
               "feature_scaling": ds.feature_scaling, "train_examples": len(ds.y_train),
               "test_examples": len(ds.y_test), "clients": len(ctx.parts),
               "client_examples": {"min": min(sizes), "median": float(np.median(sizes)),
                                   "max": max(sizes)}},
      **({"inputs": ctx.inputs} if ctx.inputs is not None else {}),
      "devices": {"count": int(sim.mesh.devices.size),
                  "platform": sim.mesh.devices.flat[0].platform,
                  "client_parallelism": sim.client_parallelism},
      "cohort_overflow": int(state.cohort_overflow),
      **({"analyzer": analyzer_summary(sim.analysis, final.get("wall_s"),
                                       statistics.median(per_round) if per_round else None,
                                       cfg.clients_per_round)}
         if sim.analysis is not None else {}),
  }


def _test_summary(cfg: Config, task: losses.Task, rows: list[dict]) -> dict:
  """The best test accuracy and what it is (classification), or what the test metrics are."""
  if "accuracy" not in task.metrics:
    return {"test_metrics_are": (
        f"the server model's {', '.join(task.metrics)} over the whole test set (test_loss: "
        f"the training loss {task.name!r})")}
  return {
      "best_test_accuracy": max((r["test_accuracy"] for r in rows
                                 if r.get("test_accuracy") is not None), default=None),
      "test_accuracy_is": (
          "SOLO: the mean over clients of each client's own model's test accuracy, with the "
          "test set reweighted to the client's training label distribution"
          if "solo" in parse_algorithm(cfg.algorithm)[0] else
          "the server model's accuracy on the whole test set")}


def analyzer_summary(report: dict, wall_s: float | None, round_s: float | None,
                     cohort: int) -> dict:
  """The analyzer's report plus its time as a share: of the run's training wall time
  (it runs once per client, before round 1), and of a round if every cohort client
  re-ran it each round (the paper's 4.3 % is an overhead share; which of the two
  it is, the paper does not say)."""
  sec = report["seconds"]
  return {**report, "time_share": {
      "of_training_wall_time": sec["all_clients"] / wall_s if wall_s else None,
      "of_a_round_if_rerun_each_round": (sec["per_client"] * cohort / round_s
                                         if round_s else None),
      "paper": 0.043}}
