"""A run's output folder: what may be there, when it may be replaced, its saved config.

`prepare_out` checks --out (a new run, --overwrite or --resume) and never loses
an existing run's results; `saved_config` reads config.json back;
`config_diff` names the keys a resume or a reuse may not change.
"""

from __future__ import annotations

import json
import os
import shutil

from fedjax_dp.config import Config

from fedjax_dp.recipes.config_checks import make_config, unread_keys
from fedjax_dp.errors import ConfigError
from fedjax_dp.data.registry import TABULAR
from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError
from fedjax_dp.experiment.reports.privacy_report import resolved_feature_scaling
from fedjax_dp.recipes.release_identity import RELEASE_NEUTRAL_KEYS

RESUMABLE_CHANGES = ("rounds",)  # config keys that may differ when resuming
# how a run is executed, not what it computes (beyond float rounding): a finished
# run is reused by run_or_reuse whatever these were (the release-neutral keys but
# eval_every, which decides which rows metrics.jsonl holds)
EXECUTION_KEYS = tuple(k for k in RELEASE_NEUTRAL_KEYS if k != "eval_every")


# where a saved config names a rule, term, mechanism or dataset this process has not
# registered (one registered from the user's own code when the run was made)
UNREGISTERED_HINT = ("; a name registered from your own code must be registered here too: "
                     "list its file in the run's plugins (--set plugins=[FILE]), pass it to "
                     "fedjax-dp attack or compare as --plugins FILE, or read the run from "
                     "Python after registering it")


def saved_config(path: str, reader: str = "--resume") -> Config:
  """The config a run folder was started with; RunError, naming `reader` (the command
  or function reading it), when it is not one."""
  try:
    with open(path) as f:
      values = json.load(f)
    if not isinstance(values, dict):
      raise ValueError("not a JSON object")
    if "feature_scaling" not in values and values.get("dataset") in TABULAR:
      # written before the key existed, when tabular data was always pooled
      values = dict(values, feature_scaling="pooled")
    return make_config(values, refuse_unread=False)   # as it was accepted when written
  except (OSError, ValueError, ConfigError) as e:
    first = str(e).splitlines()[0]
    hint = UNREGISTERED_HINT if isinstance(e, ConfigError) and "allowed" in first else ""
    raise RunError(f"{reader}: {path} is not a valid run config ({first}){hint}") from None


def rounds_done(out: str) -> int:
  """The last evaluated round in out/metrics.jsonl (0 when none is readable)."""
  return max((int(r["round"]) for r in reporting.read_metrics(os.path.join(out, "metrics.jsonl"))
              if "round" in r), default=0)


def config_diff(cfg: Config, saved: Config, free: tuple[str, ...]) -> list[str]:
  """The config keys whose values differ between cfg and saved, but those in free
  and those neither run reads (config.unread_keys: a saved run's clip_norm without
  dp is the same run as the default); feature_scaling compared as resolved ('auto'
  is 'pooled' without DP)."""
  value = lambda c, k: resolved_feature_scaling(c) if k == "feature_scaling" else getattr(c, k)
  unread = unread_keys(cfg) & unread_keys(saved)
  keys = dict.fromkeys([*cfg.to_dict(), *saved.to_dict()])   # a plugin's keys by name
  return [k for k in keys if value(cfg, k) != value(saved, k)
          and k not in free and k not in unread]


def shown_setting(cfg: Config, key: str) -> str:
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


def check_resume_or_overwrite(out: str, resume: bool, overwrite: bool) -> None:
  """RunError where both are given: one would be ignored."""
  if resume and overwrite:
    raise RunError(f"--resume with --overwrite: give one (--resume continues the run in {out}, "
                   "--overwrite replaces it)")


def prepare_out(out: str, cfg: Config, resume: bool, overwrite: bool,
                 check_only: bool = False) -> Config:
  """Checks the output folder, then (unless check_only) clears or creates it; never
  loses an existing run's results."""
  cfg_path = os.path.join(out, "config.json")
  check_resume_or_overwrite(out, resume, overwrite)
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
    diff = config_diff(cfg, saved_config(cfg_path), RESUMABLE_CHANGES)
    if diff:
      raise RunError(f"--resume: config differs from the run in {out} in {', '.join(diff)} "
                     f"(only {', '.join(RESUMABLE_CHANGES)} may change)")
    done = rounds_done(out)
    if cfg.rounds < done:
      raise RunError(f"--resume: rounds = {cfg.rounds} but the run in {out} has done {done}: "
                     f"rounds must be >= {done}")
    return cfg
  if exists and not overwrite:
    # one message for the CLI and the Python API (fedjax_dp.run's keyword arguments)
    raise RunError(f"output folder {out} is not empty: pass --overwrite (Python: "
                   "overwrite=True) to replace it or --resume (resume=True) to continue it")
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
