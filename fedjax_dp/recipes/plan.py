"""A run's plan: its config read once, at the edge, into what build_simulation
compiles (core/build.py reads no config).

  RunPlan                       the settings, the recipe's built stages, the set-up,
                                the privacy set-up and the round's numbers
  plan_run(cfg, model, ...)     the plan a config describes
  replan(plan, overrides, ...)  the same compiled round with numbers that are data
                                changed (Simulation.with_hparams, hparams_for)
  reseeded(plan, seed)          another run key on the same data (Simulation.with_seed)

The settings stay in the plan as the release's identity (release_identity.run_key
hashes them with the inputs) and as what config.json says; nothing compiled reads
a key of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.config.schema import data_seed
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy.setup import Privacy
from fedjax_dp.recipes import hparams as hparams_lib
from fedjax_dp.recipes.base import Recipe
from fedjax_dp.recipes.flat import from_config
from fedjax_dp.recipes.kept_noise_check import check_kept_noise
from fedjax_dp.recipes.privacy import make_privacy
from fedjax_dp.recipes.setup import RunSetup, run_setup


class RunPlan(NamedTuple):
  cfg: Config                  # the settings: config.json, and with the inputs the run key
  recipe: Recipe               # the run's stages, built
  setup: RunSetup              # population, local training, execution, adversary
  privacy: Privacy             # the mechanism's set-up, per-client budgets included
  hparams: dict                # the round's numbers as host arrays (hparams.round_hparams)
  feature_tiers: Any = None    # [features]: the data's sensitivity tiers (clip_parts 'tiers')
  client_budgets: Any = None   # [num_clients]: per-client target epsilons, as given
  calibrated: float | None = None   # a noise multiplier already calibrated (make_privacy)
  client_sizes: Any = None     # [num_clients] the clients' example counts, where known


def plan_run(cfg: Config, model, feature_tiers=None, client_budgets=None,
             calibrated: float | None = None, client_sizes=None) -> RunPlan:
  """The plan of `cfg` for `model` (models.Model: the privacy set-up's layout reads
  its parameters). `client_budgets` [num_clients]: per-client target epsilons
  (local DP); `calibrated`: see make_privacy; `client_sizes`: the clients' example
  counts, against which the kept noise is checked (kept_noise_check)."""
  if client_sizes is not None:
    check_kept_noise(cfg, client_sizes, model)
  privacy = _privacy(cfg, model, feature_tiers, calibrated, client_budgets)
  recipe = from_config(cfg)
  return RunPlan(cfg, recipe, run_setup(cfg), privacy,
                 hparams_lib.round_hparams(cfg, privacy, recipe), feature_tiers,
                 client_budgets, calibrated, client_sizes)


def reseeded(plan: RunPlan, seed: int) -> RunPlan:
  """`plan` with config key `seed` (the model's initialisation, cohorts, local
  training, noise) changed and `data_seed` pinned to the data it was built from."""
  from fedjax_dp.recipes.config_checks import make_config
  cfg = make_config({"seed": seed, "data_seed": data_seed(plan.cfg)}, base=plan.cfg)
  return plan._replace(cfg=cfg, setup=run_setup(cfg))


def replan(plan: RunPlan, overrides: dict, model, cache: dict | None = None) -> RunPlan:
  """`plan` with the config keys that are data (hparams.numeric_keys) in `overrides`
  changed: the settings, recipe, set-up, privacy set-up and numbers all follow, the
  derived entries (a round's RDP, budget limits) recomputed by the config path's
  own functions. Refused in one line: a key that shapes the compiled round, a change
  of the privacy set-up's structure, a key this round never reads. `cache`: make_privacy
  results by (settings, calibration), kept by the caller."""
  cfg, privacy = _settings_and_privacy(plan, overrides, model, cache)
  if plan.client_sizes is not None:   # new numbers, lr or clips may reach the kept noise's std
    check_kept_noise(cfg, plan.client_sizes, model)
  recipe = from_config(cfg)
  return plan._replace(cfg=cfg, recipe=recipe, setup=run_setup(cfg), privacy=privacy,
                       hparams=hparams_lib.round_hparams(cfg, privacy, recipe))


def _settings_and_privacy(plan: RunPlan, overrides: dict, model, cache):
  from fedjax_dp.recipes.config_checks import make_config
  bad = sorted(set(overrides) - set(hparams_lib.numeric_keys()))
  if bad:
    raise ConfigError(f"with_hparams: {', '.join(bad)} shape the compiled round (a new "
                      "simulation is needed); the keys that are data are "
                      f"{', '.join(hparams_lib.numeric_keys())}")
  cfg = make_config(overrides, base=plan.cfg)
  hparams_lib.check_same_structure(plan.cfg, cfg)
  hparams_lib.check_numbers_are_data(plan.cfg, cfg)
  hparams_lib.check_overridable(plan.cfg, overrides, plan.calibrated,
                                plan.privacy.client_budgets is not None)
  privacy = _privacy_of(plan, cfg, overrides, model, cache)
  if _structure(privacy) != _structure(plan.privacy):
    raise hparams_lib.StructureChange(f"with_hparams: {overrides} change the privacy set-up's "
                                      "structure; build a new simulation")
  for key, value in overrides.items():   # a key this round never reads: N identical replicas
    if getattr(cfg, key) != getattr(plan.cfg, key):
      one = make_config({key: value}, base=plan.cfg)
      one_hp = hparams_lib.round_hparams(one, _privacy_of(plan, one, {key: value}, model, cache),
                                         from_config(one))
      if hparams_lib.same(plan.hparams, one_hp):
        raise ConfigError(f"with_hparams: {key} = {value!r} changes nothing in this "
                          "simulation's round (its stage or schedule is not on)")
  return cfg, privacy


def _structure(p: Privacy):
  """What of a privacy set-up the compiled round is built around (a correlated-noise
  strategy's matrix too: BandMF's follows server momentum)."""
  layout = p.layout and p.layout._replace(noise_scales=p.layout.noise_scales is None)
  strategy = p.strategy and (p.strategy.says, p.strategy.sensitivity2,
                             tuple(np.asarray(p.strategy.charges).tolist()))
  return layout, p.stop_in_round, len(p.event_multipliers), strategy


def _privacy_of(plan: RunPlan, cfg: Config, overrides: dict, model, cache) -> Privacy:
  """make_privacy of changed settings (cached: a calibration with a noise schedule
  tabulates 17 RDP curves), keeping the plan's calibration unless the overrides
  recalibrate, and its per-client budgets."""
  cache = {} if cache is None else cache
  calibrated = None if hparams_lib.RECALIBRATING & set(overrides) else plan.calibrated
  if (cfg, calibrated) not in cache:
    cache[(cfg, calibrated)] = _privacy(cfg, model, plan.feature_tiers, calibrated,
                                        plan.client_budgets)
  return cache[(cfg, calibrated)]


def _privacy(cfg: Config, model, feature_tiers, calibrated, client_budgets) -> Privacy:
  """make_privacy of `cfg` with the per-client budgets (float64) attached."""
  privacy = make_privacy(cfg, model, feature_tiers, calibrated)
  if client_budgets is None:
    return privacy
  return dataclasses.replace(privacy, client_budgets=np.asarray(client_budgets, np.float64))
