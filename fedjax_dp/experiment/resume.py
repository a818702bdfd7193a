"""Resuming a run: its checkpoint, the rounds already released, and the run key.

A resume restores the newest readable checkpoint and refuses (RunError,
nothing written) to run again, differently, rounds whose outputs were already
released (RELEASED keeps the high-water mark); segments.jsonl says which
`rounds` and noise each stretch of rounds ran under.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.core.simulation import Simulation
from fedjax_dp.core.state import sampler_state
from fedjax_dp.recipes.privacy import noise_multiplier_for
from fedjax_dp.experiment import checkpoint as ckpt
from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError
from fedjax_dp.experiment.run_folder import rounds_done, saved_config
from fedjax_dp.experiment.target_epsilon import calibrated_multiplier
from fedjax_dp.placement import paged_state
from fedjax_dp.privacy import accounting
from fedjax_dp.experiment.reports import privacy_log
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.flat import kept_noise_of

SEGMENTS = "segments.jsonl"      # one row per start or resume: {from_round, rounds}
FRESH_META = {"wall_s": 0.0, "loss_sum": 0.0, "examples": 0.0}   # a run's meta at round 0
SECRET_KEY = "run_key.secret"   # noise_seed 'secret': the run key, for a restart from round 0
RELEASED = "released.json"      # the last round any output (metrics, checkpoint) came from
NOISIER = 3.0   # an extension whose recalibrated noise passes this multiple of the old is warned of


def save_secret_key(out: str, key) -> None:
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
  return max([rounds_done(out), _round_in(os.path.join(out, RELEASED), "round"),
              _round_in(os.path.join(out, "summary.json"), "rounds")]
             + ckpt.steps(os.path.join(out, "checkpoints")))


def mark_released(out: str, end: int) -> None:
  """Raises the high-water mark (it survives a resume that cuts metrics.jsonl back)."""
  if end > _round_in(os.path.join(out, RELEASED), "round"):
    reporting.write_json_atomic(os.path.join(out, RELEASED), {"round": end})


def restore(out: str, cfg: Config, sim: Simulation, state, log, calibrating: bool):
  """A resume's (state, meta, privacy_log, calibrated multiplier): the newest
  readable checkpoint (or round 0), checked against what was released, with
  the noise multiplier the rounds to come run at. RunError, nothing written,
  when the resume would change released rounds."""
  _check_strategy_rounds(out, cfg)
  ckpt_dir = os.path.join(out, "checkpoints")
  meta = dict(FRESH_META)
  if ckpt.steps(ckpt_dir):
    _, state, meta = ckpt.restore_latest(ckpt_dir, state, warn=log,
                                         side=paged_state.checkpoint_side(state)[1])
  restored = int(state.round)
  if cfg.noise_seed == "secret" and restored == 0:
    state = _restore_secret_key(out, sim, state)
  _check_rerun(out, cfg, restored, calibrating)
  log(f"resuming {out} from the checkpoint at round {restored}" if restored
      else f"no checkpoint in {out} (checkpoint_every {cfg.checkpoint_every}, or stopped before "
           "the first): --resume starts over from round 0")
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
  spent = np.asarray(state.privacy.ledger, np.float64)
  calibration = calibrated_multiplier(cfg, spent, restored)
  log(f"rounds {saved.get('rounds')} -> {cfg.rounds}: the {restored} rounds run spent "
      f"epsilon {accounting.epsilon_np(spent, cfg.delta)[0]:.4g} (RDP) of target_epsilon "
      f"{cfg.target_epsilon:g}; the rounds to come are calibrated to what is left: accounted "
      f"noise multiplier {calibration:.6g}")
  before = saved.get("noise_multiplier")
  if before and calibration > NOISIER * before:
    log(f"warning: the rounds to come get {calibration / before:.3g}x the noise of the rounds "
        f"run (multiplier {before:.4g}): a calibrated run spends its target by its last round, "
        "so little is left to extend it with, and these updates will be mostly noise")
  return state, meta, plog, calibration


def _check_strategy_rounds(out: str, cfg: Config) -> None:
  """A correlated-noise strategy is built for its run's rounds (its matrix, its
  sensitivity, the noise buffers in the checkpoint): a resume with other rounds
  would continue one strategy's noise under another's accounting."""
  if not get_mechanism(cfg.dp).charged_once:
    return
  ran = {g.get("rounds") for g in reporting.read_metrics(os.path.join(out, SEGMENTS))}
  path = os.path.join(out, "config.json")   # not yet rewritten by this resume
  if os.path.exists(path):
    ran.add(saved_config(path).rounds)
  ran -= {None}
  if ran - {cfg.rounds}:
    raise RunError(f"--resume with rounds {cfg.rounds} under dp {cfg.dp!r}: the run's "
                   f"correlated-noise strategy was built for {sorted(ran)[0]} rounds (its "
                   "matrix, sensitivity and noise buffers); resume with those rounds, or "
                   "start a new run")


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
  key = jax.numpy.asarray(key)
  # the sampler's state (balls_in_bins' bins, min_sep's table) is drawn from the run key too
  return state._replace(key=sim.replicate(key), sampler=sim.replicate(
      sampler_state(sim.sampler and sim.sampler.init, key)))


def _check_rerun(out: str, cfg: Config, restored: int, calibrating: bool) -> None:
  """RunError when a resume would run again rounds that were already released
  (the newest checkpoints were unreadable, or there were none) under another
  `rounds` that changes what those rounds compute: the learning-rate schedule
  and a calibrated noise multiplier depend on it. The re-run would then
  publish other sums under the same cohorts and noise draws, and the noise
  would no longer hide their difference. With the same `rounds` a re-run
  repeats the first release bit for bit."""
  schedules = cfg.lr_schedule == cfg.server_lr_schedule == "constant"
  if (schedules and not calibrating) or (not get_mechanism(cfg.dp).private
                                                            and kept_noise_of(cfg) is None):
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
             else "server_lr_schedule " + repr(cfg.server_lr_schedule)
             if cfg.server_lr_schedule != "constant" else "the noise calibrated to target_epsilon")
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


def plugin_digests(cfg) -> dict[str, str]:
  """{plugin: SHA-256 of its source} of the config's plugins ({} without any)."""
  from fedjax_dp.recipes.release_identity import plugin_digest
  return {p: plugin_digest(p) for p in cfg.plugins}


def check_plugins(out: str, cfg) -> None:
  """RunError where a plugin's code is not what the run's last stretch of rounds ran
  with (segments.jsonl keeps its SHA-256): an edited mechanism, term or default would
  change the rounds to come without a word, and the privacy report describes one
  mechanism for the whole run."""
  segments = reporting.read_metrics(os.path.join(out, SEGMENTS))
  if not segments or "plugins" not in segments[-1]:
    return   # no plugins (config_diff compares the lists), or a run from before the record
  ran, now = segments[-1]["plugins"], plugin_digests(cfg)
  changed = sorted(p for p in set(ran) | set(now) if ran.get(p) != now.get(p))
  if changed:
    raise RunError(f"the run in {out} ran with other code for plugin {changed[0]!r} (its "
                   f"SHA-256 in {SEGMENTS} differs): continue it with the same plugin code, "
                   "or start a new run")
