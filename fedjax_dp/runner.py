"""`run_experiment`: data -> partition -> store -> compiled rounds -> outputs and checkpoints.

The host runs one compiled chunk of rounds at a time. Chunks end at every
multiple of `eval_every` and of `checkpoint_every` (absolute round numbers),
so an interrupted and resumed run executes exactly the same chunks as an
uninterrupted one and reaches the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dp import checkpoint as ckpt
from fedjax_dp import reporting
from fedjax_dp.config import Config, make_config
from fedjax_dp.data import Dataset, load_dataset
from fedjax_dp.models import make_model, num_params
from fedjax_dp.partition import partition
from fedjax_dp.simulation import Simulation, batch_for_eval, build_simulation, make_mesh
from fedjax_dp.store import build_store


class RunError(RuntimeError):
  """A user-facing problem with the output folder or a resume; one line."""


RESUMABLE_CHANGES = ("rounds",)  # config keys that may differ when resuming


def load_data(cfg: Config) -> Dataset:
  options: dict[str, Any] = {}
  if cfg.dataset == "csv":
    options = dict(path=cfg.csv_path, label_column=cfg.label_column)
  elif cfg.dataset == "synthetic":
    options = dict(num_examples=cfg.synthetic_examples, num_features=cfg.synthetic_features,
                   num_classes=cfg.synthetic_classes)
  return load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed, **options)


def client_partition(cfg: Config, ds: Dataset) -> list[np.ndarray]:
  return partition(ds.y_train, cfg.num_clients, cfg.partition, alpha=cfg.alpha,
                   classes_per_client=cfg.classes_per_client,
                   quantity_alpha=cfg.quantity_alpha, seed=cfg.seed)


def setup(cfg: Config, ds: Dataset | None = None, mesh=None):
  """Builds (dataset, partition, simulation) for a config; the Python API's entry point."""
  ds = ds if ds is not None else load_data(cfg)
  parts = client_partition(cfg, ds)
  model = make_model(cfg.model, ds.input_shape, ds.num_classes, cfg.hidden)
  store = build_store(ds.x_train, ds.y_train, parts, pad_to_multiple=cfg.batch_size)
  return ds, parts, build_simulation(cfg, model, store, mesh)


def chunk_ends(start: int, cfg: Config) -> list[int]:
  """Round numbers at which a compiled chunk ends, after `start`."""
  ends = set(range(cfg.eval_every, cfg.rounds + 1, cfg.eval_every)) | {cfg.rounds}
  if cfg.checkpoint_every:
    ends |= set(range(cfg.checkpoint_every, cfg.rounds + 1, cfg.checkpoint_every))
  return sorted(e for e in ends if e > start)


def _prepare_out(out: str, cfg: Config, resume: bool, overwrite: bool) -> Config:
  """Checks the output folder; never loses an existing run's results."""
  cfg_path = os.path.join(out, "config.json")
  exists = os.path.isdir(out) and bool(os.listdir(out))
  if resume:
    if not os.path.exists(cfg_path):
      raise RunError(f"--resume: {out} holds no run (no config.json)")
    with open(cfg_path) as f:
      saved = make_config(json.load(f))
    diff = [k for k in dataclasses.asdict(cfg) if getattr(cfg, k) != getattr(saved, k)
            and k not in RESUMABLE_CHANGES]
    if diff:
      raise RunError(f"--resume: config differs from the run in {out} in {', '.join(diff)} "
                     f"(only {', '.join(RESUMABLE_CHANGES)} may change)")
    return cfg
  if exists:
    if not overwrite:
      raise RunError(f"output folder {out} is not empty: pass --overwrite to replace it or "
                     "--resume to continue it")
    shutil.rmtree(out)
  os.makedirs(out, exist_ok=True)
  return cfg


def run_experiment(cfg: Config, out: str, *, resume: bool = False, overwrite: bool = False,
                   progress: bool = True, log: Callable[[str], None] | None = None,
                   mesh=None) -> dict:
  """Runs (or resumes) a simulation, writing config, metrics, summary, plots, checkpoints.

  Returns the summary dict (also written to `out/summary.json`).
  """
  log = log or (lambda msg: print(msg, file=sys.stderr))
  cfg = _prepare_out(out, cfg, resume, overwrite)
  reporting.write_json_atomic(os.path.join(out, "config.json"), cfg.to_dict())
  metrics_path = os.path.join(out, "metrics.jsonl")
  ckpt_dir = os.path.join(out, "checkpoints")

  t_setup = time.perf_counter()
  ds, parts, sim = setup(cfg, mesh=mesh)
  setup_s = time.perf_counter() - t_setup
  eval_data = batch_for_eval(ds.x_test, ds.y_test, cfg.eval_batch_size)
  d = num_params(jax.tree.leaves(sim.init_state().params))
  bytes_per_update = 4 * d  # dense float32 values: no indices needed

  state = sim.init_state()
  meta = {"wall_s": 0.0, "loss_sum": 0.0, "examples": 0.0}
  if resume:
    if ckpt.steps(ckpt_dir):
      step, state, meta = ckpt.restore_latest(ckpt_dir, state, warn=log)
      log(f"resuming {out} from the checkpoint at round {step}")
    else:
      log(f"no checkpoint in {out}: starting from round 0")
    rows = [r for r in reporting.read_metrics(metrics_path) if r["round"] <= int(state.round)]
    reporting.rewrite_metrics(metrics_path, rows)
  else:
    rows = []

  start = int(state.round)
  chunk_times: list[tuple[int, float]] = []
  wall0 = time.perf_counter() - meta["wall_s"]
  loss_sum, examples = meta["loss_sum"], meta["examples"]
  bar = _progress(progress, cfg.rounds, start)
  r = start
  for end in chunk_ends(start, cfg):
    t = time.perf_counter()
    state, stats = sim.run_rounds(state, end - r)
    loss_sum += float(np.sum(stats.loss_sum))  # one host transfer per chunk
    examples += float(np.sum(stats.examples))
    chunk_times.append((end - r, time.perf_counter() - t))
    bar.update(end - r)
    r = end
    if end % cfg.eval_every == 0 or end == cfg.rounds:
      acc, test_loss = (float(v) for v in sim.evaluate(state.params, *eval_data))
      participations = int(state.participations)
      row = {"round": end, "test_accuracy": acc, "test_loss": test_loss,
             "train_loss": loss_sum / examples if examples else None,
             "epsilon": None, "delta": None,
             "bytes_up": participations * bytes_per_update,
             "bytes_down": participations * bytes_per_update,
             "wall_s": round(time.perf_counter() - wall0, 4)}
      reporting.append_metrics(metrics_path, row)
      rows.append(row)
      loss_sum = examples = 0.0
      bar.set_postfix(acc=f"{acc:.4f}")
    if cfg.checkpoint_every and (end % cfg.checkpoint_every == 0 or end == cfg.rounds):
      ckpt.save(ckpt_dir, end, state, {"wall_s": time.perf_counter() - wall0,
                                       "loss_sum": loss_sum, "examples": examples},
                keep=cfg.keep_checkpoints)
  bar.close()

  summary = _summary(cfg, ds, parts, sim, state, rows, chunk_times, setup_s, d, bytes_per_update)
  reporting.write_json_atomic(os.path.join(out, "summary.json"), summary)
  summary["plots"] = reporting.plot_metrics(rows, out)
  return summary


def _progress(enabled: bool, total: int, initial: int):
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, unit="round", disable=not enabled, file=sys.stderr,
              dynamic_ncols=True)


def _summary(cfg, ds, parts, sim: Simulation, state, rows, chunk_times, setup_s, d,
             bytes_per_update) -> dict:
  sizes = [len(p) for p in parts]
  per_round = [t / n for n, t in chunk_times[1:]] or [t / n for n, t in chunk_times]
  final = rows[-1] if rows else {}
  return {
      "final": final,
      "best_test_accuracy": max((r["test_accuracy"] for r in rows), default=None),
      "rounds": int(state.round),
      "privacy": {
          "dp": "none", "epsilon": None, "delta": None,
          "note": "no noise is added: this run has no differential-privacy guarantee",
      },
      "communication": {
          "bytes_up": final.get("bytes_up", 0), "bytes_down": final.get("bytes_down", 0),
          "bytes_per_client_up": bytes_per_update, "bytes_per_client_down": bytes_per_update,
          "encoding": "dense float32: 4 bytes per parameter each way, no indices",
          "participations": int(state.participations),
      },
      "timing": {
          "wall_s": final.get("wall_s"), "setup_s": round(setup_s, 3),
          "first_chunk_s": round(chunk_times[0][1], 3) if chunk_times else None,
          "seconds_per_round_median": statistics.median(per_round) if per_round else None,
      },
      "model": {"name": cfg.model, "params": d},
      "data": {"dataset": cfg.dataset, "source": ds.source, "train_examples": len(ds.y_train),
               "test_examples": len(ds.y_test), "clients": len(parts),
               "client_examples": {"min": min(sizes), "median": float(np.median(sizes)),
                                   "max": max(sizes)}},
      "devices": {"count": int(sim.mesh.devices.size),
                  "platform": sim.mesh.devices.flat[0].platform,
                  "client_parallelism": sim.client_parallelism},
      "cohort_overflow": int(state.cohort_overflow),
  }
