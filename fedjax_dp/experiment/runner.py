"""`run_experiment`: data -> partition -> store -> compiled rounds -> outputs and checkpoints.

The host runs one compiled chunk of rounds at a time. Chunks end at every
multiple of `eval_every` and of `checkpoint_every` (absolute round numbers),
so an interrupted and resumed run executes exactly the same chunks as an
uninterrupted one and reaches the same numbers. What happens between chunks
(evaluation, metrics.jsonl, checkpoints, the budget stop, the progress bar,
summary.json and plots) is a list of callbacks (callbacks.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dp.privacy import accounting
from fedjax_dp.experiment import checkpoint as ckpt
from fedjax_dp import losses
from fedjax_dp.experiment import reporting
from fedjax_dp.config import Config, ConfigError, make_config
from fedjax_dp.data import (TABULAR, DataError, Dataset, apply_feature_scaling, check_targets,
                            load_dataset)
from fedjax_dp.models import Model, make_model, num_params
from fedjax_dp.objectives import parse_algorithm
from fedjax_dp.data.partition import partition
from fedjax_dp.compression import pipeline
from fedjax_dp.privacy import privacy_log
from fedjax_dp.privacy.privacy_report import (_finite, clients_spent, privacy_report,
                                      resolved_feature_scaling, rounds_skipped)
from fedjax_dp.core.simulation import Simulation, build_simulation
from fedjax_dp.core.evaluate import batch_for_eval
from fedjax_dp.privacy.setup import (local_event_rdp, noise_multiplier_for, round_event_rdp,
                                     sampling_rate)
from fedjax_dp.placement.store import build_store, target_dtype


class RunError(RuntimeError):
  """A user-facing problem with the output folder or a resume; one line."""


RESUMABLE_CHANGES = ("rounds",)  # config keys that may differ when resuming
SEGMENTS = "segments.jsonl"      # one row per start or resume: {from_round, rounds}
INPUTS = "inputs.json"           # your own data, model or loss (fedjax_dp.run): what they were
# how a run is executed, not what it computes (beyond float rounding): a finished
# run is reused by run_or_reuse whatever these were
EXECUTION_KEYS = ("data_dir", "checkpoint_every", "keep_checkpoints", "devices",
                  "client_parallelism", "client_batch", "eval_batch_size")


def load_data(cfg: Config) -> Dataset:
  """The config's dataset, scaled as far as it can be before partitioning: pooled or
  none; per_client data comes back raw ('none'), for setup to scale per client."""
  if cfg.dataset == "custom":
    raise DataError("dataset 'custom' is your own data: it comes from fedjax_dp.run(data=...) "
                    "or fedjax_dp.simulate(data=...), not from a config (a run made that way "
                    "resumes from Python: fedjax_dp.run(..., resume=True))")
  options: dict[str, Any] = {}
  if cfg.dataset == "csv":
    options = dict(path=cfg.csv_path, label_column=cfg.label_column, tier_map=cfg.tier_map_path)
  elif cfg.dataset == "synthetic":
    options = dict(num_examples=cfg.synthetic_examples, num_features=cfg.synthetic_features,
                   num_classes=cfg.synthetic_classes)
  elif cfg.dataset == "healthcare":
    options = dict(num_examples=cfg.healthcare_examples)
  mode = resolved_feature_scaling(cfg)
  return load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed,
                      feature_scaling="none" if mode == "per_client" else mode, **options)


def client_partition(cfg: Config, ds: Dataset) -> list[np.ndarray]:
  return partition(ds.y_train, cfg.num_clients, cfg.partition, alpha=cfg.alpha,
                   classes_per_client=cfg.classes_per_client,
                   quantity_alpha=cfg.quantity_alpha, seed=cfg.seed)


def setup(cfg: Config, ds: Dataset | None = None, mesh=None, calibrated: float | None = None,
          *, model: Model | None = None, task: losses.Task | None = None):
  """Builds (dataset, partition, simulation) for a config; the Python API's entry point.

  The returned dataset's features are scaled as resolved_feature_scaling(cfg) says
  (per_client: each client's rows with its own statistics, after partitioning); a
  `ds` passed in must come from load_data(cfg) (or load_dataset with that scaling),
  or be your own (data.from_arrays, from_clients: config key dataset 'custom'), whose
  partition it carries. `model`: your own (models.from_flax; config key model
  'custom'); `task`: the loss and metrics (losses.py; default classification).
  The simulation's test_data holds the test set in evaluation batches.
  `calibrated`: central DP's accounted noise multiplier instead of the one calibrated
  to target_epsilon from round 0 (a resumed run's; simulation.make_privacy)."""
  task = task or losses.CLASSIFICATION
  ds = ds if ds is not None else load_data(cfg)
  if cfg.tier_source == "analyzer" and ds.x_train.ndim != 2:
    raise ConfigError(f"config key 'tier_source' = 'analyzer' with dataset {cfg.dataset!r}: the "
                      "analyzer scores the columns of tabular data (use healthcare, "
                      "breast_cancer or csv)")
  if cfg.clip_parts == "tiers" and cfg.dp != "none" and ds.feature_tiers is None \
      and cfg.tier_source == "given":
    raise ConfigError(f"config key 'clip_parts' = 'tiers' with dataset {cfg.dataset!r}: the "
                      "data has no sensitivity tiers (use dataset healthcare, or csv with "
                      "tier_map_path)")
  # labels only: the same under every scaling
  parts = own_partition(cfg, ds) if ds.client_parts is not None else client_partition(cfg, ds)
  ds = apply_feature_scaling(ds, parts, resolved_feature_scaling(cfg))
  check_targets(ds, task.target_dtype, task.name)
  if model is None:
    model = builtin_model(cfg, ds)
  elif cfg.model != "custom":
    raise ConfigError(f"a model of your own ({model.name!r}) needs config key model 'custom' "
                      f"(it is {cfg.model!r}): fedjax_dp.run and simulate set it")
  check_model(cfg, model, task, ds)
  store = build_store(ds.x_train, ds.y_train, parts, pad_to_multiple=cfg.batch_size,
                      y_dtype=task.target_dtype)
  tiers, analysis, budgets = _tiers_and_budgets(cfg, ds, parts)
  sim = build_simulation(cfg, model, store, mesh, tiers, budgets, calibrated=calibrated,
                         task=task)
  test_data = batch_for_eval(ds.x_test, ds.y_test, cfg.eval_batch_size, task.target_dtype)
  return ds, parts, dataclasses.replace(sim, analysis=analysis, test_data=test_data)


def own_partition(cfg: Config, ds: Dataset) -> list[np.ndarray]:
  """The partition your data carries (data.from_arrays), checked against the config."""
  if cfg.dataset != "custom":
    raise ConfigError(f"data of your own ({ds.name!r}) needs config key dataset 'custom' (it is "
                      f"{cfg.dataset!r}): fedjax_dp.run and simulate set it")
  if len(ds.client_parts) != cfg.num_clients:
    raise ConfigError(f"config key 'num_clients' = {cfg.num_clients}: your data has "
                      f"{len(ds.client_parts)} clients")
  return [np.asarray(p) for p in ds.client_parts]


def builtin_model(cfg: Config, ds: Dataset) -> Model:
  """The config's model for ds: as many outputs as classes (or target coordinates)."""
  if cfg.model == "custom":
    raise ConfigError("config key 'model' = 'custom': your own model is passed to "
                      "fedjax_dp.run(model=...) or simulate(model=...), not named in a config")
  return make_model(cfg.model, ds.input_shape, ds.output_size, cfg.hidden)


def check_model(cfg: Config, model: Model, task: losses.Task, ds: Dataset) -> None:
  """ConfigError (one line) when the model cannot serve the algorithm or the loss:
  MOON without a representation, SOLO without the classification loss, outputs
  whose shape the loss or its metrics refuse (checked on shapes, before compiling)."""
  terms, _ = parse_algorithm(cfg.algorithm)
  if "moon" in terms and model.apply_with_features is None:
    raise ConfigError(f"algorithm {cfg.algorithm!r} with model {model.name!r}: MOON needs the "
                      "model's representation, and this model has no with_features call (a "
                      "flax module whose __call__(x, with_features=True) returns (outputs, "
                      "representation [B, h]))")
  if "solo" in terms and task != losses.CLASSIFICATION:
    raise ConfigError(f"algorithm 'solo' with loss {task.name!r}: SOLO's evaluation reweights "
                      "the test set to each client's label distribution, which needs the "
                      "classification loss")
  y = ds.y_train
  spec = lambda shape, dtype: jax.ShapeDtypeStruct((2,) + tuple(shape), dtype)
  what = (f"model {model.name!r} with loss {task.name!r} on inputs {ds.input_shape} and "
          f"targets {tuple(y.shape[1:])} {target_dtype(y, task.target_dtype)}")
  try:
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    out = jax.eval_shape(model.apply, params, spec(ds.input_shape, np.float32))
    targets = spec(y.shape[1:], target_dtype(y, task.target_dtype))
    value = jax.eval_shape(task.loss, out, targets, spec((), bool))
    for fn in task.metrics.values():
      jax.eval_shape(fn, out, targets)
  except Exception as e:   # any error of the user's code, shown on one line
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise ConfigError(f"{what}: {type(e).__name__}: {first}") from None
  if getattr(value, "shape", None) != ():
    raise ConfigError(f"{what}: the loss returns shape {getattr(value, 'shape', None)}, "
                      "expected a scalar (the mean over the masked rows)")
  if task.target_dtype == "int32" and (len(out.shape) != 2 or out.shape[1] < ds.num_classes):
    raise ConfigError(f"{what}: outputs of shape {tuple(out.shape[1:])} per example, expected "
                      f"[{ds.num_classes}] logits (labels go up to {ds.num_classes - 1})")


def _tiers_and_budgets(cfg: Config, ds: Dataset, parts: list[np.ndarray]):
  """(feature tiers, the analyzer's report or None, per-client budgets or None)."""
  tiers, analysis, budgets = ds.feature_tiers, None, None
  client_tiers = np.full(len(parts), 1)   # medium, unless the analyzer says otherwise
  if cfg.tier_source == "analyzer":
    from fedjax_dp.privacy.analyzer import analyze_clients, thresholds
    out = analyze_clients(ds.x_train, parts, ds.sensitive, ds.feature_tiers, seed=cfg.seed,
                          semantic_steps=cfg.analyzer_steps, rule=cfg.analyzer_rule)
    tiers, analysis = out["tiers"], out["report"]
    # a client's own tier: its mean fused score over the scored features
    scored = tiers <= 2
    mean = np.nanmean(np.where(np.isnan(out["client_fused"]), np.nan,
                               out["client_fused"])[:, scored], axis=1)
    client_tiers = np.where(np.isnan(mean), 1, thresholds(np.nan_to_num(mean)))
  if cfg.client_budgets == "allocated":
    from fedjax_dp.privacy.budgets import client_budgets
    budgets = client_budgets(cfg.target_epsilon, [len(p) for p in parts], client_tiers)
    if analysis is not None:
      analysis["client_tier_counts"] = {t: int(np.sum(client_tiers == i))
                                        for i, t in enumerate(("high", "medium", "low"))}
  return tiers, analysis, budgets


def chunk_ends(start: int, cfg: Config, last: int | None = None) -> list[int]:
  """Round numbers at which a compiled chunk ends, after `start`, up to `last` (default: rounds)."""
  last = cfg.rounds if last is None else last
  ends = set(range(cfg.eval_every, last + 1, cfg.eval_every)) | {last}
  if cfg.checkpoint_every:
    ends |= set(range(cfg.checkpoint_every, last + 1, cfg.checkpoint_every))
  return sorted(e for e in ends if start < e <= last)


def budget_rounds(cfg: Config, spent_rdp=None, done: int = 0,
                  accounted: float | None = None) -> int:
  """Rounds the run may take, checked before anything is written.

  Central DP with target_epsilon: the most rounds whose accounted epsilon stays
  <= the target (the run stops before passing it). Local DP: all of them (each
  client stops on its own), but one participation must fit in the target. Also
  raises RunError for an unreachable target (make_privacy refuses an impossible
  adaptive-clipping set-up, with the clip layout). A resumed run passes what its `done` rounds spent (`spent_rdp`
  [orders], the restored ledger); the rounds to come run at `accounted`
  (default: the config's multiplier)."""
  if cfg.dp == "none":
    return cfg.rounds
  try:
    z = noise_multiplier_for(cfg) if accounted is None else accounted
  except ValueError as e:  # target epsilon out of reach
    raise RunError(str(e))
  if cfg.target_epsilon is None:
    return cfg.rounds
  if cfg.clip_parts == "tiers" or cfg.noise_schedule != "static":
    # the event depends on the tier layout and the controller: local DP checks one
    # participation after setup; central DP skips the round that would pass the target
    return cfg.rounds
  event = local_event_rdp(cfg, z) if cfg.dp == "local" else round_event_rdp(cfg, z)
  if cfg.dp == "local" or spent_rdp is None:
    spent_rdp, done = np.zeros_like(event), 0   # local DP: each client's own ledger decides
  before = np.asarray(spent_rdp, np.float64)
  # the in-round float32 ledger rounds up, by at most ~2 ulp (2.4e-7) per round:
  # stop where even that upper bound stays within the target
  ok = lambda t: accounting.epsilon_np((before + (t - done) * event) * (1 + 2.4e-7 * t),
                                       cfg.delta)[0] <= cfg.target_epsilon
  if done >= cfg.rounds or not ok(done + 1):
    if done:
      return done   # a resumed run whose budget is spent: no round more
    what = "one participation's" if cfg.dp == "local" else "one round's"
    raise RunError(f"target_epsilon {cfg.target_epsilon:g} is below {what} epsilon "
                   f"{accounting.epsilon_np(event, cfg.delta)[0]:.4g} at noise multiplier "
                   f"{z:g}: raise noise_multiplier or target_epsilon")
  if cfg.dp == "local":
    return cfg.rounds
  lo, hi = done + 1, cfg.rounds  # epsilon grows with t: find the last t with ok(t)
  if ok(hi):
    return hi
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if ok(mid) else (lo, mid)
  return lo


def calibrated_multiplier(cfg: Config, spent_rdp: np.ndarray, done: int) -> float:
  """Central DP with target_epsilon: the accounted noise multiplier for the
  `rounds - done` rounds still to run after `done` rounds spent `spent_rdp`
  [orders] (the restored ledger), so that all `rounds` together stay within the
  target. The rounds already run keep the noise they had; `noise_multiplier_for`
  is the case of nothing spent."""
  remaining = cfg.rounds - done
  aim = cfg.target_epsilon * (1.0 - 1e-5 - 3e-7 * cfg.rounds)
  used = accounting.epsilon_np(spent_rdp, cfg.delta)[0]
  if used >= aim:
    raise RunError(f"--resume: the {done} rounds already run spent epsilon {used:.4g} of "
                   f"target_epsilon {cfg.target_epsilon:g}: no room for more rounds")
  try:
    return accounting.calibrate_noise_multiplier(
        aim, sampling_rate(cfg), remaining, cfg.delta,
        epsilon_fn=lambda z: accounting.epsilon_np(
            spent_rdp + remaining * round_event_rdp(cfg, z), cfg.delta)[0])
  except ValueError as e:
    raise RunError(f"--resume: {e} for the {remaining} rounds after the {done} already run")


FRESH_META = {"wall_s": 0.0, "loss_sum": 0.0, "examples": 0.0}   # a run's meta at round 0
SECRET_KEY = "run_key.secret"   # noise_seed 'secret': the run key, for a restart from round 0
RELEASED = "released.json"      # the last round any output (metrics, checkpoint) came from


def _save_secret_key(out: str, key) -> None:
  """Writes the run key (owner-only) before any round runs: a restart from round
  0 must draw the same noise, or re-run rounds would be released twice."""
  reporting.write_json_atomic(os.path.join(out, SECRET_KEY),
                              [int(v) for v in np.asarray(key)], mode=0o600)


def _round_in(path: str, key: str) -> int:
  """The integer `key` of a JSON file (0 when it is missing or unreadable)."""
  try:
    with open(path) as f:
      return int(json.load(f)[key])
  except (OSError, ValueError, KeyError, TypeError):
    return 0


def _released_round(out: str) -> int:
  """The last round any output of the run came from: metrics rows, checkpoints
  (readable or not), the summary and the high-water mark (never lowered)."""
  return max([_rounds_done(out), _round_in(os.path.join(out, RELEASED), "round"),
              _round_in(os.path.join(out, "summary.json"), "rounds")]
             + ckpt.steps(os.path.join(out, "checkpoints")))


def mark_released(out: str, end: int) -> None:
  """Raises the high-water mark (it survives a resume that cuts metrics.jsonl back)."""
  if end > _round_in(os.path.join(out, RELEASED), "round"):
    reporting.write_json_atomic(os.path.join(out, RELEASED), {"round": end})


def _restore(out: str, cfg: Config, sim: Simulation, state, log, calibrating: bool):
  """A resume's (state, meta, privacy_log, calibrated multiplier): the newest
  readable checkpoint (or round 0), checked against what was released, with
  the noise multiplier the rounds to come run at. RunError, nothing written,
  when the resume would change released rounds."""
  ckpt_dir = os.path.join(out, "checkpoints")
  meta = dict(FRESH_META)
  if ckpt.steps(ckpt_dir):
    _, state, meta = ckpt.restore_latest(ckpt_dir, state, warn=log)
  restored = int(state.round)
  if cfg.noise_seed == "secret" and restored == 0:
    state = _restore_secret_key(out, sim, state)
  _check_rerun(out, cfg, restored, calibrating)
  log(f"resuming {out} from the checkpoint at round {restored}" if restored
      else f"no checkpoint in {out}: starting from round 0")
  plog = meta.get("privacy_log") if privacy_log.is_valid(meta.get("privacy_log")) else None
  if plog is None and restored == 0:
    plog = privacy_log.empty()   # else a checkpoint from before the log: no PLD figure
  if not calibrating:
    return state, meta, plog, None
  segments = reporting.read_metrics(os.path.join(out, SEGMENTS))
  current = [g for g in segments if g["from_round"] <= restored]
  saved = current[-1] if current else (meta.get("calibration") or {})
  if saved.get("rounds") == cfg.rounds and saved.get("noise_multiplier") is not None:
    return state, meta, plog, saved["noise_multiplier"]   # as the rounds ran, bit for bit
  if restored == 0 or restored >= cfg.rounds:
    return state, meta, plog, noise_multiplier_for(cfg)
  # other rounds: the rounds to come calibrated to what the ledger (digest-checked) left
  spent = np.asarray(state.ledger, np.float64)
  calibration = calibrated_multiplier(cfg, spent, restored)
  log(f"rounds {saved.get('rounds')} -> {cfg.rounds}: the {restored} rounds run spent "
      f"epsilon {accounting.epsilon_np(spent, cfg.delta)[0]:.4g} (RDP) of target_epsilon "
      f"{cfg.target_epsilon:g}; the rounds to come are calibrated to what is left: accounted "
      f"noise multiplier {calibration:.6g}")
  return state, meta, plog, calibration


def _restore_secret_key(out: str, sim: Simulation, state):
  """Round 0 of a noise_seed 'secret' run restarts with the key it ran with."""
  try:
    with open(os.path.join(out, SECRET_KEY)) as f:
      key = np.asarray(json.load(f), np.uint32).reshape(2)
  except (OSError, ValueError):
    if _released_round(out) > 0:
      raise RunError(f"--resume: {out} has no readable checkpoint and no {SECRET_KEY}: with "
                     "noise_seed 'secret' a restart would release its rounds again under new "
                     "noise, which no epsilon covers; start a new run") from None
    return state
  return state._replace(key=sim.replicate(jax.numpy.asarray(key)))


def _check_rerun(out: str, cfg: Config, restored: int, calibrating: bool) -> None:
  """RunError when a resume would run again rounds that were already released
  (the newest checkpoints were unreadable, or there were none) under another
  `rounds` that changes what those rounds compute: the learning-rate schedule
  and a calibrated noise multiplier depend on it. The re-run would then
  publish other sums under the same cohorts and noise draws, and the noise
  would no longer hide their difference. With the same `rounds` a re-run
  repeats the first release bit for bit."""
  if (cfg.lr_schedule == "constant" and not calibrating) or (cfg.dp == "none"
                                                            and cfg.kept_noise == "none"):
    return   # nothing changes, or no noise to reuse
  released = _released_round(out)
  if released <= restored:
    return
  segments = reporting.read_metrics(os.path.join(out, SEGMENTS)) or [
      {"from_round": 0, "rounds": saved_config(os.path.join(out, "config.json")).rounds}]
  ends = [s["from_round"] for s in segments[1:]] + [released]
  for seg, seg_end in zip(segments, ends):
    if seg["from_round"] < released and seg_end > restored and seg["rounds"] != cfg.rounds:
      why = ("lr_schedule " + repr(cfg.lr_schedule) if cfg.lr_schedule != "constant"
             else "the noise calibrated to target_epsilon")
      head = (f"--resume: the run would restart from round {restored} (newer checkpoints are "
              f"unreadable or missing) but rounds up to {released} were already released, "
              f"some with rounds = {seg['rounds']}; re-running them with rounds = {cfg.rounds} "
              f"would change them ({why}) under the same noise draws")
      if seg["rounds"] >= released and cfg.checkpoint_every:
        raise RunError(f"{head}. Resume with --set rounds={seg['rounds']} first (it repeats "
                       "them exactly), then extend")
      raise RunError(f"{head}, and no resume can repeat them as they ran (they ran under "
                     "several `rounds`, or no checkpoint would mark them): start a new run "
                     "with another --out")


def published_participations(cfg: Config, state) -> int:
  """The participations that bytes_up/bytes_down and the summary publish. Under
  central DP with Poisson sampling the realised cohort sizes are private (add/
  remove-one neighbours change them), so the expected ones are published:
  clients_per_round per round that ran (skipped rounds released nothing)."""
  if cfg.dp == "central" and cfg.sampling == "poisson":
    ran = int(state.round) - rounds_skipped(cfg, state)
    return cfg.clients_per_round * ran
  return int(state.participations)


def aggregator_metrics(cfg, flagged: float, clusters: float, rounds: int) -> dict:
  """metrics.jsonl keys of the robust aggregators, over the rounds since the last
  evaluation: `flagged` uploads (outliers detected, or left out by Krum) and the
  mean number of `clusters` per round; those the rule `reports` (robust/)."""
  from fedjax_dp import robust
  reports = robust.get_aggregator(cfg.aggregator).reports
  out = {}
  if "flagged" in reports:
    out["flagged"] = int(flagged)
  if "clusters" in reports:
    out["clusters"] = clusters / rounds if rounds else None
  return out


def spent_epsilon(sim: Simulation, state) -> dict:
  """Epsilon spent so far by the in-round ledger, for metrics.jsonl: central DP
  gives the run's epsilon; local DP the largest client's, and how many clients
  can no longer take part."""
  if sim.cfg.dp == "none":
    return {"epsilon": None, "delta": None}
  eps, _ = sim.epsilons(state)
  row = {"epsilon": _finite(np.max(eps)), "delta": sim.cfg.delta}
  if sim.cfg.dp == "local":
    row["clients_spent"] = int(np.sum(clients_spent(sim, state)))
  return row


def client_label_distribution(ds: Dataset, parts) -> np.ndarray:
  """[clients, classes]: each client's training label frequencies."""
  out = np.zeros((len(parts), ds.num_classes), np.float32)
  for i, idx in enumerate(parts):
    if len(idx):
      out[i] = np.bincount(ds.y_train[idx], minlength=ds.num_classes) / len(idx)
  return out


def saved_config(path: str) -> Config:
  """The config a run folder was started with; RunError when it is not one."""
  try:
    with open(path) as f:
      values = json.load(f)
    if not isinstance(values, dict):
      raise ValueError("not a JSON object")
    if "feature_scaling" not in values and values.get("dataset") in TABULAR:
      # written before the key existed, when tabular data was always pooled
      values = dict(values, feature_scaling="pooled")
    return make_config(values)
  except (OSError, ValueError, ConfigError) as e:
    raise RunError(f"--resume: {path} is not a valid run config ({str(e).splitlines()[0]})")


def _rounds_done(out: str) -> int:
  """The last evaluated round in out/metrics.jsonl (0 when none is readable)."""
  return max((int(r["round"]) for r in reporting.read_metrics(os.path.join(out, "metrics.jsonl"))
              if "round" in r), default=0)


def _config_diff(cfg: Config, saved: Config, free: tuple[str, ...]) -> list[str]:
  """The config keys whose values differ between cfg and saved, but those in free
  (feature_scaling compared as resolved: 'auto' is 'pooled' without DP)."""
  value = lambda c, k: resolved_feature_scaling(c) if k == "feature_scaling" else getattr(c, k)
  return [k for k in dataclasses.asdict(cfg) if value(cfg, k) != value(saved, k)
          and k not in free]


def _shown(cfg: Config, key: str) -> str:
  """A config value for a message: feature_scaling 'auto' with what it resolves to."""
  value = repr(getattr(cfg, key))
  if key == "feature_scaling" and cfg.feature_scaling == "auto":
    value += f" ({resolved_feature_scaling(cfg)})"
  return value


def make_out_folder(out: str) -> None:
  """Makes --out up front (scripts that sweep runs into it): a path that cannot be
  a folder fails as a RunError before any run."""
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise RunError(f"--out {out}: cannot make the folder ({e.strerror})") from None


def _protected_folders() -> set[str]:
  here = os.path.realpath(os.getcwd())
  out = {here, os.path.realpath(os.path.expanduser("~")), "/"}
  while os.path.dirname(here) != here:
    here = os.path.dirname(here)
    out.add(here)
  return out


def _prepare_out(out: str, cfg: Config, resume: bool, overwrite: bool,
                 check_only: bool = False) -> Config:
  """Checks the output folder, then (unless check_only) clears or creates it; never
  loses an existing run's results."""
  cfg_path = os.path.join(out, "config.json")
  if os.path.exists(out) and not os.path.isdir(out):
    raise RunError(f"output folder {out} is a file: name a folder")
  parent = os.path.dirname(os.path.abspath(out))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise RunError(f"output folder {out}: {parent} is a file, so the folder cannot be made")
  exists = os.path.isdir(out) and bool(os.listdir(out))
  if resume:
    if not os.path.exists(cfg_path):
      raise RunError(f"--resume: {out} holds no run (no config.json)")
    diff = _config_diff(cfg, saved_config(cfg_path), RESUMABLE_CHANGES)
    if diff:
      raise RunError(f"--resume: config differs from the run in {out} in {', '.join(diff)} "
                     f"(only {', '.join(RESUMABLE_CHANGES)} may change)")
    done = _rounds_done(out)
    if cfg.rounds < done:
      raise RunError(f"--resume: rounds = {cfg.rounds} but the run in {out} has done {done}: "
                     f"rounds must be >= {done}")
    return cfg
  if exists and not overwrite:
    raise RunError(f"output folder {out} is not empty: pass --overwrite to replace it or "
                   "--resume to continue it")
  if exists and not os.path.exists(cfg_path):
    # --overwrite replaces a run, never a folder of something else (or the working folder)
    raise RunError(f"--overwrite: {out} is not empty and holds no run (no config.json); "
                   "refusing to delete it: name a new or empty folder")
  if exists and os.path.realpath(out) in _protected_folders():
    raise RunError(f"--overwrite: {out} is the working folder or one of its parents; "
                   "refusing to delete it")
  if check_only:
    return cfg
  if exists:
    shutil.rmtree(out)
  os.makedirs(out, exist_ok=True)
  return cfg


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
  saved = saved_config(cfg_path)
  finished = os.path.exists(os.path.join(out, "summary.json"))
  diff = _config_diff(cfg, saved, EXECUTION_KEYS if finished else RESUMABLE_CHANGES)
  if diff and not overwrite:
    shown = "; ".join(f"{k} {_shown(saved, k)} there, {_shown(cfg, k)} asked"
                      for k in diff[:3]) + ("; ..." if len(diff) > 3 else "")
    raise RunError(f"{out} holds a run with other settings ({shown}): pass --overwrite to "
                   "rerun it, or choose another --out")
  if diff:
    return run_experiment(cfg, out, overwrite=True, **kwargs)
  if finished:
    # the same config with other data, model or loss is another run (inputs.json)
    try:
      _check_inputs(out, own_inputs(kwargs.get("model"), kwargs.get("data"),
                                    kwargs.get("task") or losses.CLASSIFICATION))
    except RunError as e:
      if not overwrite:
        raise RunError(f"{out} holds a finished run with other inputs ({e}): pass "
                       "--overwrite to rerun it, or choose another --out") from None
      return run_experiment(cfg, out, overwrite=True, **kwargs)
    with open(os.path.join(out, "summary.json")) as f:
      return json.load(f)
  return run_experiment(cfg, out, resume=True, **kwargs)


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
  from fedjax_dp import callbacks as callbacks_lib
  log = log or (lambda msg: print(msg, file=sys.stderr))
  task = task or losses.CLASSIFICATION
  ctx = _open_run(cfg, out, resume, overwrite, log, mesh, model, data, task)
  if isinstance(ctx, dict):
    return ctx   # a finished run: its summary
  ctx.progress = progress
  return callbacks_lib.run_loop(ctx, callbacks_lib.defaults() + list(callbacks))


def _open_run(cfg: Config, out: str, resume: bool, overwrite: bool, log, mesh, model, data,
              task):
  """Checks everything, then prepares `out`: the run's RunContext, or the summary of
  a finished run that a resume finds."""
  from fedjax_dp.callbacks import RunContext
  last = budget_rounds(cfg)  # fails before anything is written
  _prepare_out(out, cfg, resume, overwrite, check_only=True)
  inputs = own_inputs(model, data, task)
  if resume:
    _check_inputs(out, inputs)
  t_setup = time.perf_counter()
  # data and config errors surface here, before anything is written or replaced
  ds, parts, sim = setup(cfg, data, mesh=mesh, model=model, task=task)
  setup_s = time.perf_counter() - t_setup
  if cfg.dp == "local" and cfg.target_epsilon is not None:
    first = accounting.epsilon_np(sim.next_event_rdp(sim.init_state()), cfg.delta)[0]
    if first > np.max(sim.client_budgets()):
      raise RunError(f"target_epsilon {cfg.target_epsilon:g}: one participation costs epsilon "
                     f"{first:.4g}, more than any client's budget (largest "
                     f"{np.max(sim.client_budgets()):.4g}): raise noise_multiplier or "
                     "target_epsilon")
  calibrating = cfg.dp == "central" and cfg.noise_multiplier is None
  calibration = from_zero = noise_multiplier_for(cfg) if calibrating else None
  state = sim.init_state()
  meta = dict(FRESH_META)
  plog = privacy_log.empty()
  if resume:
    # everything is checked before a file is touched: a refused resume leaves the run as it was
    state, meta, plog, calibration = _restore(out, cfg, sim, state, log, calibrating)
    if calibration != from_zero:   # ds is scaled: reload
      _, _, sim = setup(cfg, data, mesh=mesh, calibrated=calibration, model=model, task=task)
    if cfg.dp == "central":
      last = budget_rounds(cfg, np.asarray(state.ledger, np.float64), int(state.round),
                           calibration)
  cfg = _prepare_out(out, cfg, resume, overwrite)
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
  return RunContext(cfg=cfg, out=out, sim=sim, ds=ds, parts=parts, task=task, log=log,
                    state=state, start=start, last=last, plog=plog, calibration=calibration,
                    meta=meta, rows=rows, setup_s=setup_s, num_params=d,
                    comm=pipeline.communication(cfg, d),  # per participant and round, each way
                    inputs=inputs)


def _write_run_files(out: str, cfg: Config, state, start: int, calibration, inputs) -> None:
  """config.json, the secret run key, inputs.json and this segment's row."""
  reporting.write_json_atomic(os.path.join(out, "config.json"), cfg.to_dict())
  if cfg.noise_seed == "secret" and start == 0:
    _save_secret_key(out, state.key)
  if inputs is not None:
    reporting.write_json_atomic(os.path.join(out, INPUTS), inputs)
  # which `rounds` (and calibration) each stretch of rounds ran under (_check_rerun)
  reporting.append_metrics(os.path.join(out, SEGMENTS), {
      "from_round": start, "rounds": cfg.rounds, "noise_multiplier": calibration})


def own_inputs(model: Model | None, data: Dataset | None, task: losses.Task) -> dict | None:
  """What a run's own data, model and loss were (None: all the config's): names,
  sizes and SHA-256 digests of the data and of the model's parameter shapes."""
  if model is None and data is None and task == losses.CLASSIFICATION:
    return None
  inputs = {"loss": {"name": task.name, "target_dtype": task.target_dtype,
                     "metrics": list(task.metrics), "sha256": _loss_digest(task)}}
  if data is not None:
    h = hashlib.sha256()
    for a in (data.x_train, data.y_train, data.x_test, data.y_test,
              *(data.client_parts or ())):
      a = np.ascontiguousarray(a)
      h.update(f"{a.dtype.str}{a.shape}".encode())
      h.update(a.tobytes())
    inputs["data"] = {"name": data.name, "source": data.source, "sha256": h.hexdigest(),
                      "train_examples": len(data.y_train), "test_examples": len(data.y_test)}
  if model is not None:
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    described = str(jax.tree.map(lambda a: (a.shape, str(a.dtype)), shapes))
    # the traced initialisation runs the module's forward pass once: its program tells a
    # relu from a tanh model of the same shapes (names and shapes alone did not)
    program = str(jax.make_jaxpr(model.init)(jax.random.PRNGKey(0)))
    inputs["model"] = {"name": model.name,
                       "params_sha256": hashlib.sha256(described.encode()).hexdigest(),
                       "program_sha256": hashlib.sha256(program.encode()).hexdigest(),
                       "params": num_params(shapes),
                       "with_features": model.apply_with_features is not None}
  return inputs


def _loss_digest(task: losses.Task) -> str:
  """SHA-256 of the loss's traced program on small examples (two lambdas with the
  same name differ), or of its code where it cannot be traced on them."""
  import jax.numpy as jnp
  y = jnp.zeros((2,), task.target_dtype)
  mask = jnp.ones((2,), bool)
  for outputs in (jnp.zeros((2, 3)), jnp.zeros((2, 1)), jnp.zeros((2,))):
    try:
      return hashlib.sha256(str(jax.make_jaxpr(task.loss)(outputs, y, mask)).encode()).hexdigest()
    except Exception:   # shapes this loss does not take: try the next
      continue
  code = getattr(task.loss, "__code__", None)
  text = repr(task.loss) if code is None else repr((code.co_code, code.co_consts, code.co_names))
  return hashlib.sha256(text.encode()).hexdigest()


def _check_inputs(out: str, inputs: dict | None) -> None:
  """RunError when a resume's own data, model or loss differ from the run's."""
  path = os.path.join(out, INPUTS)
  try:
    with open(path) as f:
      saved = json.load(f)
  except FileNotFoundError:
    saved = None
  except (OSError, ValueError) as e:
    raise RunError(f"--resume: {path} is unreadable ({e.__class__.__name__}): it says which "
                   "data, model and loss the run had") from None
  if saved == inputs:
    return
  if inputs is None:
    raise RunError(f"--resume: the run in {out} was made by fedjax_dp.run with your own "
                   f"{', '.join(k for k in ('data', 'model', 'loss') if k in saved)} "
                   f"({INPUTS}): resume it from Python with fedjax_dp.run(..., resume=True)")
  if saved is None:
    raise RunError(f"--resume: the run in {out} used the config's data, model and loss; "
                   "resume it without data=, model= or loss=")
  differ = [k for k in ("data", "model", "loss") if saved.get(k) != inputs.get(k)]
  raise RunError(f"--resume: the {' and '.join(differ)} differ from those of the run in {out} "
                 f"({INPUTS}): resume with the same ones, or start a new run")


def run_summary(ctx, stopped: bool | None = None) -> dict:
  """summary.json of a run (callbacks.RunContext) at its end; `stopped`: a budget
  ended it before `rounds`."""
  cfg, ds, sim, state, rows = ctx.cfg, ctx.ds, ctx.sim, ctx.state, ctx.rows
  sizes = [len(p) for p in ctx.parts]
  times = ctx.chunk_times
  per_round = [t / n for n, t in times[1:]] or [t / n for n, t in times]
  final = rows[-1] if rows else {}
  return {
      "final": final,
      **_test_summary(cfg, ctx.task, rows),
      "rounds": int(state.round),
      "privacy": privacy_report(cfg, sim, state, ctx.plog, assume=False,
                                stopped_by_budget=stopped),
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
      "best_test_accuracy": max((r["test_accuracy"] for r in rows), default=None),
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
