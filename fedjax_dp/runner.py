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
from types import SimpleNamespace
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dp import accounting
from fedjax_dp import checkpoint as ckpt
from fedjax_dp import losses
from fedjax_dp import reporting
from fedjax_dp.config import Config, ConfigError, make_config
from fedjax_dp.data import (TABULAR, DataError, Dataset, apply_feature_scaling, check_targets,
                            load_dataset)
from fedjax_dp.models import Model, make_model, num_params
from fedjax_dp.objectives import parse_algorithm
from fedjax_dp.partition import partition
from fedjax_dp import pipeline
from fedjax_dp import privacy_log
from fedjax_dp.simulation import (Simulation, batch_for_eval, budget_limit, build_simulation,
                                  learning_rate_schedule,
                                  local_event_rdp, make_mesh, neighbouring_relation,
                                  noise_multiplier_for, round_event_rdp, sampling_rate)
from fedjax_dp.store import build_store, target_dtype


class RunError(RuntimeError):
  """A user-facing problem with the output folder or a resume; one line."""


RESUMABLE_CHANGES = ("rounds",)  # config keys that may differ when resuming
SEGMENTS = "segments.jsonl"      # one row per start or resume: {from_round, rounds}
INPUTS = "inputs.json"           # your own data, model or loss (fedjax_dp.run): what they were
# how a run is executed, not what it computes (beyond float rounding): a finished
# run is reused by run_or_reuse whatever these were
EXECUTION_KEYS = ("data_dir", "checkpoint_every", "keep_checkpoints", "devices",
                  "client_parallelism", "client_batch", "eval_batch_size")


def resolved_feature_scaling(cfg: Config) -> str:
  """cfg.feature_scaling with 'auto' resolved: 'pooled' when dp is 'none', 'per_client'
  under DP (pooled statistics would carry every client's raw data into every client's
  inputs without noise); image datasets are never standardised: 'none'."""
  if cfg.feature_scaling != "auto":
    return cfg.feature_scaling
  if cfg.dataset not in TABULAR:
    return "none"
  return "pooled" if cfg.dp == "none" else "per_client"


def data_not_accounted(cfg: Config) -> list[str]:
  """The privacy report's not_accounted lines the data preparation causes (none
  without DP): pooled standardisation under DP."""
  if cfg.dp == "none" or resolved_feature_scaling(cfg) != "pooled":
    return []
  return ["feature_scaling 'pooled': the standardisation mean and deviation are computed from "
          "every client's raw training data without noise, so one client's data moves every "
          "client's inputs in every round; that influence is not covered by epsilon (use "
          "feature_scaling 'per_client' or 'none')"]


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
    from fedjax_dp.analyzer import analyze_clients, thresholds
    out = analyze_clients(ds.x_train, parts, ds.sensitive, ds.feature_tiers, seed=cfg.seed,
                          semantic_steps=cfg.analyzer_steps, rule=cfg.analyzer_rule)
    tiers, analysis = out["tiers"], out["report"]
    # a client's own tier: its mean fused score over the scored features
    scored = tiers <= 2
    mean = np.nanmean(np.where(np.isnan(out["client_fused"]), np.nan,
                               out["client_fused"])[:, scored], axis=1)
    client_tiers = np.where(np.isnan(mean), 1, thresholds(np.nan_to_num(mean)))
  if cfg.client_budgets == "allocated":
    from fedjax_dp.budgets import client_budgets
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


def rounds_skipped(cfg: Config, state) -> int:
  """Rounds a budget skipped inside the compiled round (they released nothing)."""
  return int(state.server_state["noise_control"]["skipped"]) if cfg.dp != "none" else 0


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
  mean number of `clusters` per round."""
  if cfg.aggregator in ("outlier_median", "krum", "multi_krum"):
    return {"flagged": int(flagged)}
  if cfg.aggregator == "cluster":
    return {"clusters": clusters / rounds if rounds else None}
  return {}


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


def clients_spent(sim: Simulation, state) -> np.ndarray:
  """[num_clients] bool: local DP clients whose next participation would pass the target."""
  cfg = sim.cfg
  if cfg.dp != "local" or cfg.target_epsilon is None:
    return np.zeros(cfg.num_clients, bool)
  after = np.asarray(state.ledger, np.float64) + sim.next_event_rdp(state)
  return accounting.epsilons_np(after, cfg.delta)[0] > budget_limit(sim.client_budgets())


def _finite(x) -> float | None:
  x = float(x)
  return x if np.isfinite(x) else None


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
                     "metrics": list(task.metrics)}}
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
    inputs["model"] = {"name": model.name,
                       "params_sha256": hashlib.sha256(described.encode()).hexdigest(),
                       "params": num_params(shapes),
                       "with_features": model.apply_with_features is not None}
  return inputs


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


def privacy_report(cfg: Config, sim: Simulation, state, plog: dict | None = None,
                   assume: bool = True, stopped_by_budget: bool | None = None) -> dict:
  """What is guaranteed (the accountant's figure), how, and what is not accounted.

  `plog`: the run's privacy_log (what each round released). Without it, and
  `assume` (the Python API on a state that `sim` ran from round 0), every round
  is taken to have run with `sim`'s noise, which the report says; with
  `assume` False (a run resumed from a checkpoint older than the log) the
  figures that need the log are left out, also said. The assumed record is
  checked against the state's ledger: where they differ, no figure is built
  from it. `stopped_by_budget`: whether a budget ended the run before `rounds`
  (run_experiment knows; default: whether a round was skipped for it)."""
  assumed = False
  if plog is None and assume and cfg.dp != "none" and sim.privacy.schedule == "static":
    plog = _assumed_log(cfg, sim, state)
    assumed = True
    if cfg.dp == "central" and not _log_matches_ledger(cfg, plog, state):
      plog, assumed = None, "mismatch"
  report = _privacy_report(cfg, sim, state, plog, stopped_by_budget)
  if assumed == "mismatch":
    report["noise_events_source"] = ("none: no per-round record was given, and this "
                                     "simulation's noise does not compose to the state's ledger "
                                     "(the state did not come from it): only the ledger's "
                                     "epsilon is given")
  elif assumed:
    report["noise_events_source"] = ("assumed: no per-round record was given, so every round "
                                     "is taken to have run with this simulation's noise (it "
                                     "composes to the state's ledger)")
  if cfg.kept_noise != "none":
    from fedjax_dp.topksdp_privacy import topksdp_report
    d = num_params(jax.tree.leaves(state.params))
    sizes = [int(n) for n in np.asarray(sim.store.client_count)]
    # each round's noise at the learning rate it ran with (a resume may change the schedule)
    lrs = privacy_log.round_lrs(plog) if plog is not None else None
    report["kept_noise"] = topksdp_report(cfg, d, int(state.round), sizes, round_lrs=lrs)
    if cfg.dp == "none":
      report["note"] = ("no user-level DP (dp none); the client-side noise on kept coordinates "
                        "is reported under kept_noise")
  if cfg.dp != "none" or cfg.kept_noise != "none":
    report["assumes"] = assumptions(cfg)
  return report


def _log_matches_ledger(cfg: Config, plog: dict, state) -> bool:
  """The record's RDP against the in-round ledger (float32, rounded up by at most
  ~2.4e-7 per round): equal to that rounding, where the ledger is finite."""
  host = privacy_log.composed_rdp(plog, lambda z: round_event_rdp(cfg, z))
  ledger = np.asarray(state.ledger, np.float64)
  ok = np.isfinite(ledger) & np.isfinite(host)
  return bool(np.all(np.isfinite(ledger) == np.isfinite(host))
              and np.allclose(ledger[ok], host[ok], rtol=1e-5, atol=1e-7))


def _assumed_log(cfg: Config, sim: Simulation, state) -> dict:
  """A privacy_log of `state`'s rounds all at `sim`'s static noise (and lr schedule)."""
  released = int(state.round) - rounds_skipped(cfg, state) if cfg.dp == "central" else 0
  lr_at = learning_rate_schedule(cfg)
  stats = dict(event=np.zeros(released, np.int32),
               lr=np.asarray([lr_at(t) for t in range(int(state.round))], np.float32),
               nonfinite=0)
  return privacy_log.append(privacy_log.empty(), SimpleNamespace(**stats),
                            sim.privacy.event_multipliers)


def assumptions(cfg: Config) -> list[str]:
  """What every guarantee of the run takes for granted about things outside it."""
  seed = ("noise_seed 'secret': the noise and cohort keys come from the operating system's "
          "entropy and are not in config.json; the checkpoints hold the run key and so must "
          "stay as secret as the noise" if cfg.noise_seed == "secret" else
          f"the seed ({cfg.seed}, published in config.json) and the checkpoints stay secret: "
          "every noise draw and cohort is a function of the seed, so anyone who has it can "
          "subtract the noise from two released models (noise_seed 'secret' draws the keys "
          "from the operating system instead)")
  return [seed,
          "the checkpoints also hold unnoised per-client state (error-feedback residuals, "
          "control variates, local models, per-client ledgers) and the unnoised diagnostics: "
          "they are the server's private working state, not releases"]


def _add_pld(report: dict, compute: Callable[[], float], accountant: str) -> None:
  """PLD's figure beside the RDP one, the smaller as epsilon; if PLD cannot be had
  (too little noise for its discretisation) the RDP figure stands, and the report
  says why."""
  from fedjax_dp.account import AccountError
  try:
    report["pld_epsilon"] = compute()
  except AccountError as e:
    report["pld_epsilon"] = None
    report["pld_note"] = f"no PLD figure: {e}; epsilon is the RDP accountant's"
    return
  report["accountant"] = accountant
  report["epsilon"] = min(report["pld_epsilon"], report["epsilon"] or np.inf)


def _privacy_report(cfg: Config, sim: Simulation, state, plog: dict | None,
                    stopped_by_budget: bool | None = None) -> dict:
  if cfg.dp == "none":
    return {"dp": "none", "epsilon": None, "delta": None,
            "note": "no noise is added: this run has no differential-privacy guarantee"}
  skipped = rounds_skipped(cfg, state)
  rounds = int(state.round) - skipped   # rounds that ran (skipped ones released nothing)
  if plog is not None and cfg.dp == "central":
    assert privacy_log.released_rounds(plog) == rounds, (plog, rounds)
  z = sim.noise_multiplier
  eps, order = sim.epsilons(state)
  report = {
      "dp": cfg.dp, "delta": cfg.delta, "noise_multiplier": z,
      "noise_multiplier_source": "configured" if cfg.noise_multiplier is not None
                                 else f"calibrated to target_epsilon {cfg.target_epsilon:g}",
      "clip_norm": cfg.clip_norm, "clip_parts": cfg.clip_parts,
      "sampling": cfg.sampling, "q": sampling_rate(cfg), "rounds_accounted": rounds,
      "target_epsilon": cfg.target_epsilon,
      "accountant": "rdp (in-round ledger, dp-accounting's default orders)",
      "not_accounted": [
          "metrics.jsonl's train_loss, unclipped_fraction and nonfinite_uploads (uploads with "
          "a NaN or inf, sent as zero) are computed from the clients' data without noise: "
          "simulator diagnostics, not outputs the epsilon covers",
          "summary.json's data section (clients, examples per client, training and test "
          "examples) is computed from the data without noise"],
  }
  if cfg.clip_parts == "per_layer":
    layout = sim.privacy.layout
    report["part_clip_norms"] = {n: f * cfg.clip_norm for n, f in zip(layout.names,
                                                                      layout.fractions)}
    report["clip_parts_note"] = (
        "each layer clipped to clip_norm * sqrt(size / total), isotropic noise: the parts "
        "compose to one Gaussian with the same noise multiplier")
  if cfg.clip_parts == "tiers":
    layout = sim.privacy.layout
    z = sim.noise_multiplier
    z_u = sim.privacy.update_noise_multiplier   # z, raised by adaptive clipping's count
    report["tiers"] = {
        name: {"clip_norm": f * cfg.clip_norm, "noise_std": z_u * cfg.clip_norm * m,
               "noise_multiplier": z_u * m / f}
        for name, f, m in zip(layout.names, layout.fractions, layout.noise_scales)}
    report["effective_noise_multiplier"] = sim.privacy.accounted_noise_multiplier
    report["clip_parts_note"] = (
        "each tier clipped on its own to clip_norm * sqrt(size / total) and noised with std "
        "noise_multiplier * clip_norm * its tier multiplier; the tiers are Gaussians on the "
        "same record, so their RDP adds (one Gaussian with the effective noise multiplier), "
        f"it does not take the maximum. First-layer rows take their feature's tier; every "
        f"other parameter takes rest_tier {cfg.rest_tier!r}")
  if cfg.dp == "central":
    report.update({
        "mechanism": ("DP-FedAvg (user level): each client's update clipped to L2 norm "
                      "clip_norm, N(0, (noise_multiplier * clip_norm)^2) added to the sum, "
                      "divided by the expected cohort size clients_per_round"),
        "guarantee": f"the accountant's epsilon below, for {neighbouring_relation(cfg)} "
                     "neighbours",
        "neighbouring": neighbouring_relation(cfg),
        "epsilon": _finite(eps), "order": float(order) if _finite(eps) is not None else None,
        "ledger": np.asarray(state.ledger, np.float64).tolist(),
        "stopped_by_budget": (skipped > 0 if stopped_by_budget is None
                              else bool(stopped_by_budget)),
        "rounds_skipped_by_budget": skipped,
    })
    if cfg.adaptive_clipping:
      report["adaptive_clipping"] = {
          "method": "Andrew et al. 2021, geometric update to a target quantile",
          "target_quantile": cfg.target_quantile, "clip_lr": cfg.clip_lr,
          "count_stddev": sim.privacy.count_stddev,
          "update_noise_multiplier": sim.privacy.update_noise_multiplier,
          "accounted_noise_multiplier": sim.privacy.accounted_noise_multiplier,
          "final_clip_norm": float(state.clip_norm),
          "note": "the noised clipped-count query is accounted: the updates' noise "
                  "(update_noise_multiplier on each clip part) and the count's (count_stddev, "
                  "sensitivity 1/2) compose to one Gaussian with accounted_noise_multiplier"}
    events = privacy_log.noise_events(plog) if plog is not None else None
    if events is not None:
      report["noise_events"] = [{"accounted_noise_multiplier": m, "rounds": n}
                                for m, n in events]
      if len({m for m, _ in events}) > 1:
        report["noise_events_note"] = (
            "the rounds ran at different accounted multipliers (a noise schedule, or a resume "
            "that calibrated the rounds after it to what was left of target_epsilon); every "
            "figure composes each round at its own")
    if cfg.accountant == "pld" and z > 0 and rounds > 0:
      if events is None:
        report["pld_epsilon"] = None
        report["pld_note"] = ("no PLD figure: the run resumed from a checkpoint without the "
                              "per-round record; epsilon is the RDP ledger's")
      else:
        from fedjax_dp.account import pld_epsilon_composed
        # each released round's composed multiplier (tiers: less than z), as the ledger charges
        _add_pld(report, lambda: pld_epsilon_composed(sampling_rate(cfg), events, cfg.delta),
                 "rdp ledger in the round; final figure by dp-accounting's PLD")
    if cfg.sampling == "poisson":
      report["q_configured"] = cfg.clients_per_round / cfg.num_clients
      report["q_note"] = ("q is the rate the sampler really draws with (float32 "
                          "uniforms on a 2^-23 grid), which the accountant charges")
      report["published_cohort_sizes"] = (
          "expected only: bytes_up, bytes_down and participations count clients_per_round per "
          "round (the realised Poisson cohort sizes depend on who is in the data)")
      report["not_accounted"].append(
          "summary.json's cohort_overflow counts Poisson draws beyond max_cohort, a function "
          "of the realised cohort sizes")
    overflow = int(state.cohort_overflow)
    if overflow:
      report["not_accounted"].append(
          f"{overflow} Poisson draws were dropped because the cohort was full (max_cohort); the "
          "analysis assumes every draw takes part: raise max_cohort")
  else:
    nc = state.server_state["noise_control"]
    counts = np.asarray(nc["participations"]) if z > 0 else None
    spent = clients_spent(sim, state)
    report.update({
        "mechanism": ("local DP: each client clips its update to L2 norm clip_norm and adds "
                      "N(0, (noise_multiplier * clip_norm)^2) from its own key before sending; "
                      "the server averages the participants' reports"),
        "guarantee": ("per client: its epsilon below covers everything it sent (replace-one "
                      "neighbours of its data, sensitivity 2 clip_norm), against the server and "
                      "anyone who sees the reports; no amplification by sampling is claimed"),
        "neighbouring": "replace one client's data (sensitivity 2 clip_norm)",
        "epsilon": _finite(np.max(eps)), "epsilon_is": "the largest client's",
        "clients": {
            "epsilon_median": _finite(np.median(eps)),
            "participations": ({"min": int(counts.min()), "median": float(np.median(counts)),
                                "max": int(counts.max())} if counts is not None else None),
            "spent": int(spent.sum()),
            "stopped_by_budget": "clients stop taking part when their next participation "
                                 "would pass target_epsilon" if cfg.target_epsilon else None},
        "client_epsilons": [_finite(e) for e in eps],
    })
    if cfg.accountant == "pld" and z > 0 and counts.max() > 0:
      # static noise (config): every participation is a Gaussian of at least the composed
      # multiplier (cluster_noise only adds), so the most frequent client's count bounds all
      from fedjax_dp.account import pld_epsilon
      z_acc = sim.privacy.accounted_noise_multiplier
      _add_pld(report, lambda: pld_epsilon(1.0, z_acc / 2, int(counts.max()), cfg.delta),
               "rdp ledgers in the round; largest client's figure by PLD")
    budgets = sim.client_budgets()
    if cfg.client_budgets == "allocated":
      report["client_budgets"] = {
          "method": "projected gradient ascent with momentum (eta 0.01, mu 0.9) on "
                    "sum_i 1 - exp(-gamma_i eps_i), gamma_i = n_i / mean n, sum eps_i <= "
                    "num_clients * target_epsilon, each eps_i in its sensitivity tier's range",
          "min": float(budgets.min()), "median": float(np.median(budgets)),
          "max": float(budgets.max()), "sum": float(budgets.sum()),
          "budgets": budgets.tolist()}
      report["clients"]["stopped_by_budget"] = ("clients stop taking part when their next "
                                                "participation would pass their own budget")
    if cfg.cluster_noise == "equalize":
      from fedjax_dp.noise_control import cluster_noise_factors
      cn = state.server_state["cluster_noise"]
      f = np.asarray(cluster_noise_factors(cn["size"], cn["median"]), np.float64)
      report["cluster_noise"] = {
          "method": "per-cluster noise: a client last seen in a cluster of s members noises "
                    "with z sqrt(s / median cluster size), never below z; its own ledger "
                    "composes the noise it really used",
          "next_round_factor": {"min": float(f.min()), "median": float(np.median(f)),
                                "max": float(f.max())},
          "last_median_cluster_size": float(cn["median"])}
    if z > 0:
      paper = np.asarray(nc["paper_epsilon"], np.float64)
      report["paper_formula_epsilon"] = {
          "is": "NOT a guarantee: the dynamic-DP paper's per-round charge "
                "sqrt(2 ln(1.25/delta)) / z_round, summed over each client's participations "
                "(its calibration needs epsilon < 1 per round, and the sum ignores delta)",
          "max": float(paper.max()), "median": float(np.median(paper))}
  nc = state.server_state["noise_control"]
  if cfg.dp == "central" and z > 0:
    report["paper_formula_epsilon"] = {
        "is": "NOT a guarantee: the dynamic-DP paper's per-round charge "
              "sqrt(2 ln(1.25/delta)) / z_round summed over the rounds run (no sampling, "
              "needs epsilon < 1 per round, ignores delta)",
        "total": float(nc["paper_epsilon_rounds"])}
  if cfg.noise_schedule != "static":
    report["noise_schedule"] = {
        "schedule": cfg.noise_schedule, "measure": cfg.convergence_measure,
        "lambda": cfg.convergence_lambda, "window": cfg.convergence_window,
        "beta": cfg.convergence_beta, "ema": cfg.noise_ema,
        "final_score": float(nc["score"]),
        "note": "each round's noise is set before the round from earlier released global "
                "updates (public), and the ledgers compose every round at its actual noise"}
  if cfg.tier_source == "analyzer" and cfg.clip_parts == "tiers":
    report["not_accounted"].append(
        "the tier map comes from the sensitivity analyzer, which reads every client's data "
        "without noise; the choice of tiers (and so of noise per feature) is not covered")
  report["not_accounted"] += data_not_accounted(cfg)
  if cfg.client_budgets == "allocated":
    report["not_accounted"].append(
        "client_budgets 'allocated': each client's budget is computed without noise from every "
        "client's example count" + (" and the sensitivity analyzer's scores of their raw data"
                                    if cfg.tier_source == "analyzer" else "")
        + ", and it decides when each client stops taking part")
  if z == 0:
    report["note"] = "noise_multiplier 0: no differential-privacy guarantee (epsilon infinite)"
  return report


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
