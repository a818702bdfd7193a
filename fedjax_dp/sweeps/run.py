"""`run_sweep`: every cell of a sweep, as replicas of as few compiled programs as can be.

    out/
      experiment.json   this folder holds a sweep (experiment/batch.py's claim)
      sweep.json        the sweep as asked (spec, cells, their programs) and, at the
                        end, what was written
      cells/<name>/     each cell's ordinary run folder (config.json, metrics.jsonl,
                        summary.json, model.msgpack, plots; checkpoints if asked)
      results.csv, results.parquet
                        the tidy table: one row per cell x evaluation (table.py)
      final.csv         per setting (cells but their seeds): mean and sd over seeds
      <metric>.png      mean +- sd over seeds against rounds, one line per setting

Programs: cells whose configs differ only in seeds and numeric hyperparameters
(recipes/hparams.NUMERIC_KEYS) share one simulation (one compiled program): the
first cell's, and the others' are its `with_seed` / `with_hparams`. A change the
round cannot take as data (hparams.StructureChange: momentum switched on, a noise
multiplier set or not, ...) and any other key make a program of their own.

Resuming: the whole request is checked before the first run (every cell's
config, every cell folder already there, the data). A sweep run again into its
folder keeps its finished cells (reused, not run), resumes unfinished ones from
their newest checkpoint (checkpoint_every), or starts them over, and runs the
new ones; a cell folder holding another run is an error unless `overwrite`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Callable

from fedjax_dp import losses
from fedjax_dp.config import Config
from fedjax_dp.recipes import hparams as hparams_lib
from fedjax_dp.experiment import batch
from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError
from fedjax_dp.experiment import releases
from fedjax_dp.experiment.inputs_fingerprint import check_inputs, own_inputs
from fedjax_dp.experiment.resume import check_plugins
from fedjax_dp.experiment.setup import check_test_source, natural_clients, run_task
from fedjax_dp.experiment.run_folder import EXECUTION_KEYS, RESUMABLE_CHANGES, config_diff, \
    saved_config
from fedjax_dp.sweeps.spec import Cell, SweepSpec

OWNER = {"experiment": "sweep"}
SWEEP_JSON = "sweep.json"
CELLS = "cells"


def cell_dir(out: str, cell: Cell) -> str:
  return os.path.join(out, CELLS, cell.name)


def program_key(cfg: Config) -> tuple:
  """What a program's cells share: every key but the seed and the numbers the
  compiled round takes as data."""
  free = set(hparams_lib.numeric_keys()) | {"seed"}
  return tuple((k, getattr(cfg, k)) for k in cfg.to_dict() if k not in free)


@dataclasses.dataclass
class _Plan:
  """What a cell needs: 'kept' (finished), 'resume', 'fresh' or 'overwrite'."""
  cell: Cell
  action: str


def plan_cells(cells: list[Cell], out: str, overwrite: bool, inputs) -> list[_Plan]:
  """Each cell's action, from its folder; RunError (nothing run) for a folder that
  holds another run (unless overwrite) and for a missing dataset. `inputs`: cfg ->
  the cell's own data, model and loss (inputs_fingerprint.own_inputs)."""
  from fedjax_dp.experiment.target_epsilon import budget_rounds
  batch.check_request([(cell_dir(out, c), c.cfg) for c in cells], overwrite)
  for cell in cells:   # a target no round can meet fails here, not after other programs
    try:
      budget_rounds(cell.cfg)
    except RunError as e:
      raise RunError(f"sweep cell {cell.name!r}: {e}") from None
  plans = []
  for cell in cells:
    where = cell_dir(out, cell)
    if not os.path.exists(os.path.join(where, "config.json")):
      plans.append(_Plan(cell, "overwrite" if os.path.isdir(where) and os.listdir(where)
                         and overwrite else "fresh"))
      continue
    saved = saved_config(os.path.join(where, "config.json"), "fedjax-dp sweep")
    finished = os.path.exists(os.path.join(where, "summary.json"))
    if config_diff(cell.cfg, saved, EXECUTION_KEYS if finished else RESUMABLE_CHANGES):
      plans.append(_Plan(cell, "overwrite"))   # reuse_conflict allowed it: overwrite
      continue
    try:   # the same config with other data, model, loss or plugin code is another run
      check_inputs(where, inputs(cell.cfg))
      check_plugins(where, cell.cfg)
    except RunError as e:
      if not overwrite:
        raise RunError(f"{where} holds a run with other inputs ({e}): pass --overwrite to "
                       "rerun it, or choose another --out") from None
      plans.append(_Plan(cell, "overwrite"))
      continue
    plans.append(_Plan(cell, "kept" if finished else "resume"))
  return plans


def run_sweep(spec: SweepSpec, out: str, *, overwrite: bool = False, progress: bool = True,
              log: Callable[[str], None] | None = None, model=None, data=None,
              task: losses.Task | None = None, callbacks=()) -> dict:
  """Runs (or continues) the sweep into `out` (see the module docstring); returns
  sweep.json's contents."""
  from fedjax_dp.experiment import callbacks as callbacks_lib
  from fedjax_dp.sweeps import table
  callbacks = callbacks_lib.check_callbacks(callbacks)
  log = log or (lambda msg: print(msg, file=sys.stderr))
  cells = spec.cells()   # every cell's config checked before anything is written
  if data is not None:   # and every cell's guarantee against your data's test set (its own
    for cell in cells:   # clients as the cell takes them)
      check_test_source(cell.cfg, natural_clients(cell.cfg, data))

  def inputs(cfg):   # a cell's own data, model and loss (its dataset's task if none given)
    return own_inputs(model, data, task or run_task(cfg, data), run_task(cfg, data))
  if os.path.exists(out) and not os.path.isdir(out):
    raise RunError(f"output folder {out} is a file: name a folder")
  if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(
      os.path.join(out, batch.OWNER)):
    raise RunError(f"output folder {out} is not empty and holds no sweep: name a new or empty "
                   "folder (a sweep's own folder is continued)")
  plans = plan_cells(cells, out, overwrite, inputs)
  batch.claim_tree(out, OWNER)
  kept = sum(p.action == "kept" for p in plans)
  if kept:
    log(f"continuing the sweep in {out}: {kept} of {len(cells)} cells finished (kept)")
  record = {"spec": spec.to_dict(), "named_by": spec.named_keys(),
            "cells": [{"name": c.name, "values": c.values} for c in cells]}
  reporting.write_json_atomic(os.path.join(out, SWEEP_JSON), record)
  t0 = time.perf_counter()
  todo = [p for p in plans if p.action != "kept"]
  programs = _run_programs(todo, out, spec, log, progress, model, data, task, inputs, callbacks)
  record.update(programs=programs, wall_s=round(time.perf_counter() - t0, 3),
                **table.write_results(out, cells, spec.named_keys(),
                                      task or run_task(cells[0].cfg, data)))
  record["privacy"] = releases.sweep_privacy([c.cfg for c in cells],
                                             releases.sweep_outputs(out, record))
  reporting.write_json_atomic(os.path.join(out, SWEEP_JSON), record)
  return record


def _run_programs(todo: list[_Plan], out, spec, log, progress, model, data, task, inputs,
                  callbacks) -> list[dict]:
  """Runs the cells in `todo`, program by program; returns one entry a program."""
  groups: dict[tuple, list[_Plan]] = {}
  for plan in todo:
    groups.setdefault(program_key(plan.cell.cfg), []).append(plan)
  queue = list(groups.values())
  bar = _progress_bar(progress, sum(p.cell.cfg.rounds for p in todo))
  done = []
  try:
    while queue:
      plans = queue.pop(0)
      entry, leftover = _run_program(plans, out, spec, log, bar, model, data, task, inputs,
                                     callbacks, len(done) + 1)
      if leftover and leftover[0] is plans[0]:   # (with_seed of its own seed cannot refuse)
        raise RuntimeError(f"sweep: cell {plans[0].cell.name!r} could not join its own program")
      done.append(entry)
      if leftover:
        queue.insert(0, leftover)
  finally:
    if bar is not None:
      bar.close()
  return done


def _run_program(plans, out, spec, log, bar, model, data, task, inputs, callbacks, number):
  """One compiled program: the first cell's simulation and every cell that can be
  its replica; returns (its sweep.json entry, the cells that cannot)."""
  from fedjax_dp.experiment import callbacks as callbacks_lib
  from fedjax_dp.experiment.runner import open_context
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.sweeps.replicas import replica_batch_size, run_batch
  first = plans[0].cell.cfg
  task = task or run_task(first, data)   # the program's dataset's, where none is given
  t = time.perf_counter()
  ds, parts, sim = setup(first, data, model=model, task=task)
  setup_s = time.perf_counter() - t
  ctxs, cbs, leftover, members = [], [], [], []
  for plan in plans:
    cell = plan.cell
    try:
      cell_sim = sim.with_seed(cell.cfg.seed).with_hparams(**{
          k: getattr(cell.cfg, k) for k in hparams_lib.numeric_keys()
          if getattr(cell.cfg, k) != getattr(sim.cfg, k)})
    except hparams_lib.StructureChange:
      leftover.append(plan)
      continue
    if cell_sim.cfg != cell.cfg:   # make_config resolved something else: run it on its own
      leftover.append(plan)
      continue
    name = cell.name

    def rebuild(calibration, cfg=cell.cfg):
      return setup(cfg, data, calibrated=calibration, model=model, task=task)[2]
    ctx = open_context(cell.cfg, cell_dir(out, cell), cell_sim, ds, parts, task,
                       resume=plan.action == "resume", overwrite=plan.action == "overwrite",
                       log=lambda msg, name=name: log(f"[{name}] {msg}"),
                       inputs=inputs(cell.cfg),
                       setup_s=setup_s, rebuild=rebuild)
    members.append(name)
    if isinstance(ctx, dict):
      continue   # a resume found it finished
    ctx.progress = False
    ctxs.append(ctx)
    cbs.append(callbacks_lib.defaults() + [_advance(bar)] + list(callbacks))
  size = replica_batch_size(spec.replica_batch, sim.mesh.devices.flat[0].platform,
                            sim.paging is not None)
  batches: dict[tuple, list[int]] = {}
  for i, ctx in enumerate(ctxs):   # one program (a rebuilt resume is its own) and start round
    batches.setdefault((id(ctx.sim.run_chunk), ctx.start), []).append(i)
  if size > 1 and any(c.sim.paging is not None for c in ctxs):
    size = 1
  log(f"program {number}: {len(members)} cell(s) on one compiled round "
      f"(replica_batch {size})")
  for idx in batches.values():
    run_batch([ctxs[i] for i in idx], [cbs[i] for i in idx], size)
  entry = {"cells": members, "replica_batch": size, "setup_s": round(setup_s, 3)}
  return entry, leftover


def _progress_bar(progress: bool, total: int):
  if not progress:
    return None
  from tqdm import tqdm
  return tqdm(total=total, unit="round", desc="sweep", file=sys.stderr, dynamic_ncols=True)


def _advance(bar):
  """A callback moving the sweep's bar by the rounds a cell ran."""
  from fedjax_dp.experiment.callbacks import Callback
  if bar is None:
    return Callback()
  def after(ctx, stats) -> None:   # (tqdm's update returns True when it redraws)
    bar.update(ctx.round - ctx.prev_round)
  return Callback(after_chunk=after)


def read_record(out: str) -> dict:
  with open(os.path.join(out, SWEEP_JSON)) as f:
    return json.load(f)
