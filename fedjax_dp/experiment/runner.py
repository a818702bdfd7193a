"""`run_experiment`: data -> partition -> store -> compiled rounds -> outputs and checkpoints.

The host runs one compiled chunk of rounds at a time. Chunks end at every
multiple of `eval_every` and of `checkpoint_every` (absolute round numbers),
so an interrupted and resumed run executes exactly the same chunks as an
uninterrupted one and reaches the same numbers. What happens between chunks
(evaluation, metrics.jsonl, checkpoints, the budget stop, the progress bar,
summary.json and plots) is a list of callbacks (callbacks.py).

A run is put together by setup.py, checked against its output folder
(run_folder.py), its privacy budget (target_epsilon.py) and, when resumed,
against what it already released (resume.py, inputs_fingerprint.py); its
summary.json is summary.py's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import jax
import numpy as np

from fedjax_dp import losses
from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.compression import pipeline
from fedjax_dp.config import Config
from fedjax_dp.recipes.privacy import noise_multiplier_for
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.experiment import reporting
from fedjax_dp.experiment.loop import chunk_ends  # noqa: F401  (public here too)
from fedjax_dp.errors import RunError
from fedjax_dp.experiment.inputs_fingerprint import INPUTS, check_inputs, own_inputs
from fedjax_dp.experiment.resume import (FRESH_META, SEGMENTS, check_plugins, plugin_digests,
                                         restore, save_secret_key)
from fedjax_dp.experiment.run_folder import (EXECUTION_KEYS, RESUMABLE_CHANGES, config_diff,
                                             prepare_out, saved_config, shown_setting)
from fedjax_dp.experiment.setup import run_task, setup
from fedjax_dp.experiment.target_epsilon import budget_rounds
from fedjax_dp.models import Model, num_params
from fedjax_dp.placement import processes
from fedjax_dp.privacy import accounting
from fedjax_dp.experiment.reports import privacy_log
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.experiment import header, interrupts, noise_note

__all__ = ["RunError", "chunk_ends", "reuse_conflict", "run_experiment", "run_or_reuse"]


def run_or_reuse(cfg: Config, out: str, *, overwrite: bool = False, **kwargs) -> dict:
  """run_experiment for scripts that sweep many runs into one tree: a finished run
  in `out` with the same config is reused (its summary.json), an unfinished one
  is resumed; a run there with other settings is a RunError naming them (its
  results would otherwise be reported under the new settings), unless
  `overwrite`, which reruns it from scratch. A finished run is reused whatever
  its EXECUTION_KEYS were; an unfinished one resumes only with the same config
  but RESUMABLE_CHANGES, as --resume does."""
  cfg_path = os.path.join(out, "config.json")
  if not os.path.exists(cfg_path):
    return run_experiment(cfg, out, overwrite=overwrite, **kwargs)
  problem = reuse_conflict(cfg, out, overwrite)
  if problem:
    raise RunError(problem)
  saved = saved_config(cfg_path, "reusing " + out)
  finished = os.path.exists(os.path.join(out, "summary.json"))
  if config_diff(cfg, saved, EXECUTION_KEYS if finished else RESUMABLE_CHANGES):
    return run_experiment(cfg, out, overwrite=True, **kwargs)
  if finished:
    # the same config with other data, model or loss is another run (inputs.json)
    try:
      default = run_task(cfg, kwargs.get("data"))
      check_inputs(out, own_inputs(kwargs.get("model"), kwargs.get("data"),
                                    kwargs.get("task") or default, default))
      check_plugins(out, cfg)
    except RunError as e:
      if not overwrite:
        raise RunError(f"{out} holds a finished run with other inputs ({e}): pass "
                       "--overwrite to rerun it, or choose another --out") from None
      return run_experiment(cfg, out, overwrite=True, **kwargs)
    with open(os.path.join(out, "summary.json")) as f:
      return json.load(f)
  return run_experiment(cfg, out, resume=True, **kwargs)


def reuse_conflict(cfg: Config, out: str, overwrite: bool) -> str | None:
  """Why run_or_reuse would refuse `out` for `cfg` (a run there with other settings,
  without `overwrite`), else None; reads only config.json and summary.json."""
  cfg_path = os.path.join(out, "config.json")
  if overwrite or not os.path.exists(cfg_path):
    return None
  saved = saved_config(cfg_path, "reusing " + out)
  finished = os.path.exists(os.path.join(out, "summary.json"))
  diff = config_diff(cfg, saved, EXECUTION_KEYS if finished else RESUMABLE_CHANGES)
  if not diff:
    return None
  shown = "; ".join(f"{k} {shown_setting(saved, k)} there, {shown_setting(cfg, k)} asked"
                    for k in diff[:3]) + ("; ..." if len(diff) > 3 else "")
  return (f"{out} holds a run with other settings ({shown}): pass --overwrite to rerun it, "
          "or choose another --out")


def run_experiment(cfg: Config, out: str, *, resume: bool = False, overwrite: bool = False,
                   progress: bool = True, log: Callable[[str], None] | None = None,
                   mesh=None, model: Model | None = None, data: Dataset | None = None,
                   task: losses.Task | None = None, callbacks=()) -> dict:
  """Runs (or resumes) a simulation, writing config, metrics, summary, plots, checkpoints.

  model, data, task: your own model (config key model 'custom'), data (dataset
  'custom', with its partition) and loss (losses.Task), as fedjax_dp.run passes
  them; None: the config's and classification. What they were is kept in
  inputs.json, and a resume with others is refused. `callbacks` (callbacks.Callback)
  run after the defaults, which write what `fedjax-dp run` writes.
  Returns the summary dict (also written to `out/summary.json`).
  """
  from fedjax_dp.experiment import callbacks as callbacks_lib
  callbacks = callbacks_lib.check_callbacks(callbacks)
  log = log or (lambda msg: print(msg, file=sys.stderr))
  if not processes.is_primary():   # one voice for a run of many processes (processes.py)
    log, progress = (lambda msg: None), False
  task = task or run_task(cfg, data)
  ctx = _open_run(cfg, out, resume, overwrite, log, mesh, model, data, task)
  if isinstance(ctx, dict):
    return ctx   # a finished run: its summary
  ctx.progress = progress
  return callbacks_lib.run_loop(ctx, callbacks_lib.defaults() + callbacks)


def _open_run(cfg: Config, out: str, resume: bool, overwrite: bool, log, mesh, model, data,
              task):
  """Checks everything, then prepares `out`: the run's RunContext, or the summary of
  a finished run that a resume finds."""
  budget_rounds(cfg)   # fails before anything is written
  prepare_out(out, cfg, resume, overwrite, check_only=True)
  inputs = own_inputs(model, data, task, run_task(cfg, data))
  if resume:
    check_inputs(out, inputs)
  t_setup = time.perf_counter()
  # data and config errors surface here, before anything is written or replaced
  ds, parts, sim = setup(cfg, data, mesh=mesh, model=model, task=task)
  # a Ctrl-C a library swallowed while JAX and the data loaded (interrupts.py) ends the
  # run here, before anything is written (it ran on to round 5: the independent audit)
  interrupts.check()
  rebuild = lambda calibration: setup(cfg, data, mesh=mesh, calibrated=calibration,
                                      model=model, task=task)[2]
  return open_context(cfg, out, sim, ds, parts, task, resume=resume, overwrite=overwrite,
                      log=log, inputs=inputs, setup_s=time.perf_counter() - t_setup,
                      rebuild=rebuild)


def open_context(cfg: Config, out: str, sim, ds: Dataset, parts, task: losses.Task, *,
                 resume: bool, overwrite: bool, log, inputs, setup_s: float,
                 rebuild: Callable):
  """The RunContext of `cfg` in `out` on a built simulation (setup's, or a sweep's
  with_hparams / with_seed of one), or the summary of a finished run a resume finds.
  Restores a resume's checkpoint; `rebuild(calibration) -> Simulation` builds the
  simulation again where a resume's calibrated noise differs from `sim`'s. Writes
  config.json and this segment's row."""
  from fedjax_dp.experiment.loop import RunContext
  last = budget_rounds(cfg)
  if get_mechanism(cfg.dp).per_client_ledgers and cfg.target_epsilon is not None:
    # per-cluster noise gives each client its own first event ([clients, orders]): the
    # cheapest one decides whether anyone can take part
    first = float(np.min(accounting.epsilons_np(sim.next_event_rdp(sim.init_state()),
                                                cfg.delta)[0]))
    if first > np.max(sim.client_budgets()):
      raise RunError(f"target_epsilon {cfg.target_epsilon:g}: one participation costs epsilon "
                     f"{first:.4g}, more than any client's budget (largest "
                     f"{np.max(sim.client_budgets()):.4g}): raise noise_multiplier or "
                     "target_epsilon")
  calibrating = get_mechanism(cfg.dp).calibrates_to_target and cfg.noise_multiplier is None
  calibration = from_zero = noise_multiplier_for(cfg) if calibrating else None
  state = sim.init_state()
  meta = dict(FRESH_META)
  plog = privacy_log.empty()
  if resume:
    # everything is checked before a file is touched: a refused resume leaves the run as it was
    check_plugins(out, cfg)
    state, meta, plog, calibration = restore(out, cfg, sim, state, log, calibrating)
    if calibration != from_zero:   # ds is scaled: reload
      sim = rebuild(calibration)
    if get_mechanism(cfg.dp).noises_sum:
      last = budget_rounds(cfg, np.asarray(state.privacy.ledger, np.float64), int(state.round),
                           calibration)
  # every process has read and checked the folder before process 0 changes it (the
  # others must not check it again: they would find process 0's new files)
  processes.barrier("fedjax_dp.run_folder_checked")
  if processes.is_primary():
    cfg = prepare_out(out, cfg, resume, overwrite)
  start = int(state.round)
  summary_path = os.path.join(out, "summary.json")
  if resume and start >= last and os.path.exists(summary_path):
    # a finished run: rewriting its summary would lose its timing
    log(f"{out} has already run its {start} rounds: nothing to do")
    with open(summary_path) as f:
      return json.load(f)
  _write_run_files(out, cfg, state, start, calibration, inputs)
  metrics_path = os.path.join(out, "metrics.jsonl")
  rows = []
  if resume:
    rows = [r for r in reporting.read_metrics(metrics_path) if r["round"] <= start]
    reporting.rewrite_metrics(metrics_path, rows)
  d = num_params(jax.tree.leaves(sim.init_state().params))
  log(header.line(cfg, sim.model.name, d, int(sim.mesh.devices.size),
                  sim.mesh.devices.flat[0].platform, start, data_name=ds.name))
  for line in noise_note.lines(cfg, sim.noise_multiplier, calibrating, sim.privacy.strategy,
                               sim.privacy.update_noise_multiplier, sim.privacy.count_stddev):
    log(line)
  return RunContext(cfg=cfg, out=out, sim=sim, ds=ds, parts=parts, task=task, log=log,
                    state=state, start=start, last=last, plog=plog, calibration=calibration,
                    meta=meta, rows=rows, setup_s=setup_s, num_params=d,
                    comm=communication(cfg, d),  # per participant and round, each way
                    inputs=inputs)


def communication(cfg: Config, d: int) -> dict:
  """pipeline.communication of this run's model (d parameters), links and terms."""
  terms, _ = parse_algorithm(cfg.algorithm)
  return pipeline.communication(d, cfg.s_local, cfg.s_global, tuple(terms))


def _write_run_files(out: str, cfg: Config, state, start: int, calibration, inputs) -> None:
  """config.json, the secret run key, inputs.json and this segment's row."""
  reporting.write_json_atomic(os.path.join(out, "config.json"), cfg.to_dict())
  if cfg.noise_seed == "secret" and start == 0:
    save_secret_key(out, state.key)
  if inputs is not None:
    reporting.write_json_atomic(os.path.join(out, INPUTS), inputs)
  # which `rounds` (and calibration) each stretch of rounds ran under (_check_rerun)
  reporting.append_metrics(os.path.join(out, SEGMENTS), {
      "from_round": start, "rounds": cfg.rounds, "noise_multiplier": calibration,
      **({"plugins": plugin_digests(cfg)} if cfg.plugins else {})})   # (check_plugins)
