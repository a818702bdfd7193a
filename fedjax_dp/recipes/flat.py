"""`from_config`: the flat Config (CLI, YAML, config.json) read as a recipe.

Each stage is built by its own module (registry lookups, the pipeline's stages,
the server stage specs) from the config's keys, and keeps the keys it stands
for, so that `from_config(cfg).to_config(**setup of cfg)` is `cfg` again. Which
keys belong to which stage, and which constructor argument each is, is declared
once, in each key's row (config/keys.py `feeds`); the tables here are read from
those rows.
"""

from __future__ import annotations

import inspect
from typing import Any

from fedjax_dp.privacy import budgets, dp_round, mechanisms, noise_control
from fedjax_dp.privacy.mechanisms import kept_noise

from fedjax_dp.compression import pipeline

from fedjax_dp import robust
from fedjax_dp.training import server_stages
from fedjax_dp.algorithms import registry
from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.config.keys import KEYS
from fedjax_dp.config.plugin_keys import PLUGIN_KEYS
from fedjax_dp.recipes.base import RECIPE_KEYS, Choice, Recipe

def _take(cfg, keys) -> dict[str, Any]:
  return {k: getattr(cfg, k) for k in keys}


def feeds(keys=None) -> dict[tuple[str, str], tuple[tuple[str, str], ...]]:
  """(slot, stage name) -> ((config key, constructor argument), ...): the `feeds` of
  `keys` (default: the built-in rows and those plugins registered); stage '*' is
  whichever fills the slot, and a feed without an argument is the key's own name."""
  out: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
  for key in (keys if keys is not None else (*KEYS, *PLUGIN_KEYS.values())):
    for feed in key.feeds:
      slot, _, target = feed.partition(":")
      stage, _, arg = target.partition(".")
      out[slot, stage] = out.get((slot, stage), ()) + ((key.name, arg or key.name),)
  return out


FEEDS = feeds(KEYS)   # the built-in rows' (a plugin's are added by feeds())


def _fed(slot: str, stage: str = "*") -> tuple[str, ...]:
  """The built-in keys that feed `stage` of `slot` (config/keys.py)."""
  return tuple(key for key, _ in FEEDS.get((slot, stage), ()))


def _arguments(cfg, slot: str, stage: str) -> dict[str, Any]:
  """{constructor argument: cfg's value} of the keys that feed `stage` of `slot`."""
  return {arg: getattr(cfg, key) for key, arg in FEEDS.get((slot, stage), ())}


# the keys each slot's stage stands for, as config/keys.py's rows declare them
SERVER_OPTIMIZER_KEYS = _fed("server_optimizer")
MECHANISM_KEYS = _fed("privacy")
PLANNER_KEYS = _fed("planner")
ADAPTIVE_KEYS = _fed("adaptive_clip")
KEPT_NOISE_KEYS = _fed("upload", "gaussian_on_kept")


def stage_keys(slot: str, name: str) -> tuple[str, ...]:
  """The config keys that feed the registered stage `name` of `slot` ('term',
  'aggregator'): the values a recipe keeps for it."""
  return tuple(key for key, _ in feeds().get((slot, name), ()))


def build_stage(slot: str, name: str, cfg):
  """The registered stage `name` built from cfg's values of the keys that feed it
  (a user's stage without keys: its constructor's defaults). An aggregator that is
  not registered is get_aggregator's ValueError, naming the registered ones."""
  fed = feeds().get((slot, name), ())
  numbers = {arg: getattr(cfg, key) for key, arg in fed}
  if slot == "term":
    make = registry.TERMS[name]
  else:
    make = robust.AGGREGATORS.get(name)
    if make is None:
      return robust.get_aggregator(name, **numbers)   # its ValueError names the registered
  _check_arguments(make, slot, name, fed)
  return make(**numbers)


def _check_arguments(make, slot: str, name: str, fed) -> None:
  """ConfigError where a key feeds an argument the stage's constructor does not take
  (a plugin's key row naming it wrongly)."""
  try:
    params = inspect.signature(make).parameters
  except (TypeError, ValueError):
    return
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return
  for key, arg in fed:
    if arg not in params:
      raise ConfigError(f"config key {key!r} feeds {slot}:{name}.{arg}, but {name}() takes "
                        f"no argument {arg!r} (it takes {', '.join(params) or 'none'})")


def term_choices(cfg) -> tuple[Choice, ...]:
  """The algorithm's local terms (registry order) built from cfg, with their keys."""
  names, _ = registry.parse_algorithm(cfg.algorithm)
  return tuple(Choice(build_stage("term", n, cfg), _take(cfg, stage_keys("term", n)))
               for n in registry.TERMS if n in names)


def aggregator_choice(cfg) -> Choice:
  """The aggregation rule built from cfg, with its keys (ValueError: not registered)."""
  return Choice(build_stage("aggregator", cfg.aggregator, cfg),
                {"aggregator": cfg.aggregator,
                 **_take(cfg, stage_keys("aggregator", cfg.aggregator))})


def upload_choices(cfg) -> tuple[Choice, ...]:
  """The client upload stages (pipeline.upload_stages) with their keys; kept_noise_draw
  'auto' resolves as kept_noise_draw (below) does (the set-up's Byzantine clients
  included: the recipe of a run is read from its whole config)."""
  stages = _upload_stages(cfg, kept_noise_draw(cfg))
  kept = kept_noise_of(cfg)
  return tuple(Choice(s, _take(cfg, _kept_noise_keys(kept) if s.name == "gaussian_on_kept" else
                               _fed("upload", s.name))) for s in stages)


def _kept_noise_keys(kept) -> tuple[str, ...]:
  """The keys the kept-noise stage stands for: the switch, who draws, and those its
  calibration reads (another is read by nothing, and refused so)."""
  return tuple(k for k in KEPT_NOISE_KEYS if k in kept_noise.STAGE_KEYS or k in kept.reads)


def kept_noise_settings(cfg, kept) -> dict[str, Any]:
  """{config key: cfg's value} of the keys calibration `kept` reads (its settings)."""
  return _take(cfg, kept.reads)


def _upload_stages(cfg, draw: str) -> list:
  """The client stages the config's pipeline keys name, in the paper's order:
  clip, top-k with error feedback, noise on the kept coordinates (`draw`: its
  resolved kept_noise_draw). Stages a combination check refuses are still
  built (final_clip_l2 without top-k, kept noise without a clip): recipes
  read their properties and refuse them with a one-line message."""
  stages = []
  if cfg.coordinate_clip is not None:
    stages.append(pipeline.clip_per_coordinate(**_arguments(cfg, "upload", "clip_per_coordinate")))
  if cfg.update_clip_l2 is not None:
    stages.append(pipeline.clip_l2(**_arguments(cfg, "upload", "clip_l2")))
  if cfg.s_local > 0:
    stages.append(pipeline.topk_with_error_feedback(**_arguments(cfg, "upload", "topk")))
  elif cfg.final_clip_l2 is not None:
    stages.append(pipeline.clip_sent(**_arguments(cfg, "upload", "clip_sent")))
  kept = kept_noise_of(cfg)
  if kept is not None:
    stages.append(kept_noise.client_stage(kept, kept_noise_settings(cfg, kept), noise_clip(cfg),
                                          cfg.s_local, draw))
  return stages


def server_choices(cfg) -> tuple[Choice, ...]:
  """The server stages the config turns on, in the round's order (the DP
  mechanism's noise controller comes with the mechanism: Recipe.server_stages)."""
  out = []
  if cfg.s_global > 0:
    out.append(Choice(server_stages.downlink_topk_spec(**_arguments(cfg, "server",
                                                                    "downlink_topk")),
                      _take(cfg, _fed("server", "downlink_topk"))))
  if cfg.index_selection == "public_topk":
    out.append(Choice(server_stages.public_update_spec(),
                      _take(cfg, _fed("server", "public_update"))))
  return tuple(out)


def privacy_choices(cfg) -> dict[str, Choice | None]:
  """The DP mechanism, its noise planner (a mechanism always has one; a varying
  schedule without a mechanism is kept for validate to refuse), adaptive
  clipping and per-client budgets."""
  mechanism = mechanisms.get_mechanism(cfg.dp)
  on = mechanism.private
  return {
      "privacy": Choice(mechanism, _take(cfg, MECHANISM_KEYS)) if on else None,
      "planner": (Choice(noise_control.PLANNERS[cfg.noise_schedule], _take(cfg, PLANNER_KEYS))
                  if on or cfg.noise_schedule != "static" else None),
      "adaptive_clip": (Choice(dp_round.ADAPTIVE_CLIPPING, _take(cfg, ADAPTIVE_KEYS))
                        if cfg.adaptive_clipping else None),
      "budgets": (Choice(budgets.ALLOCATED, _take(cfg, _fed("budgets")))
                  if cfg.client_budgets == "allocated" else None),
  }


def server_optimizer_name(cfg: Config) -> str:
  """`server_optimizer`, or with 'auto' the one the algorithm implies
  (fedavgm: momentum, fedadam: adam, otherwise sgd)."""
  if cfg.server_optimizer != "auto":
    return cfg.server_optimizer
  return registry.parse_algorithm(cfg.algorithm)[1]


def from_config(cfg: Config) -> Recipe:
  """The recipe of `cfg` (any Config: a combination validate refuses is still
  read, so that validate can name it). Raises ValueError for an algorithm or
  aggregator that is not registered (fedjax_dp.make_config names those first).

  Built once per start: the config's check and the run's plan get the same
  recipe, kept for the last (config, registries) pair it was built from (a
  registry that changed since, a plugin's stage registered or replaced, builds
  it afresh; a Recipe and its stages are immutable)."""
  key = (cfg, _registries())
  try:
    hash(key)
  except TypeError:   # a registered object that cannot be hashed: no reuse
    return _read(cfg)
  if key not in _LAST_BUILT:
    recipe = _read(cfg)
    _LAST_BUILT.clear()
    _LAST_BUILT[key] = recipe
  return _LAST_BUILT[key]


_LAST_BUILT: dict = {}   # {(cfg, _registries()): its recipe}, one entry


def _registries() -> tuple:
  """What a recipe is built from besides the config: every registry's entries (the
  objects themselves, so an entry replaced under its name is a new key)."""
  return tuple(tuple(r.items()) for r in (
      registry.TERMS, registry.ALGORITHMS, robust.AGGREGATORS, mechanisms.MECHANISMS,
      mechanisms.KEPT_NOISE, PLUGIN_KEYS, pipeline.SHUFFLERS, noise_control.PLANNERS))


def _read(cfg: Config) -> Recipe:
  """from_config's recipe, built."""
  recipe = Recipe(
      name=mechanisms.get_mechanism(cfg.dp).recipe_prefix + cfg.algorithm,
      algorithm=cfg.algorithm,
      terms=term_choices(cfg),
      upload=upload_choices(cfg),
      shuffle=(Choice(pipeline.SHUFFLERS[cfg.shuffle], _take(cfg, _fed("shuffle")))
               if cfg.shuffle != "none" else None),
      aggregator=aggregator_choice(cfg),
      server=server_choices(cfg),
      server_optimizer=Choice(server_optimizer_name(cfg),
                              _take(cfg, SERVER_OPTIMIZER_KEYS)),
      **privacy_choices(cfg))
  unused = {k: getattr(cfg, k) for k in unread_keys_of(recipe)
            if getattr(cfg, k) != getattr(Config(), k)}   # (a plugin's key: its default)
  return recipe.replace(unused=unused)


def unread_keys_of(recipe: Recipe) -> frozenset[str]:
  """The recipe keys (RECIPE_KEYS, and plugins' keys) that no stage of `recipe`
  stands for: whatever their values, the round does not read them."""
  owned = {k for c in recipe.choices() for k in c.config} | {"algorithm"}
  return frozenset(k for k in (*RECIPE_KEYS, *PLUGIN_KEYS) if k not in owned)


def kept_noise_of(cfg) -> mechanisms.KeptNoise | None:
  """The calibration of the noise on the kept coordinates the config names
  (privacy/mechanisms/kept_noise.py), None for 'none': the one reader of the
  config's kept_noise value. A name not registered is a ConfigError (a recipe
  built in Python with a misspelt name would otherwise run without the noise)."""
  if cfg.kept_noise == "none":
    return None
  if cfg.kept_noise not in mechanisms.KEPT_NOISE:
    raise ConfigError(f"config key 'kept_noise' = {cfg.kept_noise!r}: allowed values are "
                      f"{', '.join(('none', *mechanisms.KEPT_NOISE))}")
  return mechanisms.KEPT_NOISE[cfg.kept_noise]


def noise_clip(cfg) -> float | None:
  """The clip the kept-coordinate noise is calibrated to: the final L2 clip when
  set (it bounds what is sent), else the per-coordinate or the update L2 clip
  (None: none is set, which recipes refuse with kept noise)."""
  clips = (cfg.final_clip_l2, cfg.coordinate_clip, cfg.update_clip_l2)
  return next((c for c in clips if c is not None), None)


def local_noise_draw(cfg) -> str:
  """Who draws local DP's report noise: 'aggregate' (one draw for the reports' sum,
  the same distribution) where the mechanism noises each report and nothing reads a
  single one (the mean aggregator, no Byzantine clients, server norm bound or audit
  canaries), else 'client'; an explicit choice is kept. 'client' under every other
  mechanism (the key is not read there). The release's identity reads this value
  (release_identity.settings_digest), so that a run whose reports' noise is drawn
  for the sum is never the release of one whose reports drew their own."""
  if mechanisms.get_mechanism(cfg.dp).report_noise is None:
    return "client"
  if cfg.local_noise_draw != "auto":
    return cfg.local_noise_draw
  reads = (cfg.aggregator != "mean" or cfg.byzantine_fraction > 0
           or cfg.server_clip_l2 is not None or cfg.audit_canaries > 0)
  return "client" if reads else "aggregate"


def kept_noise_draw(cfg) -> str:
  """'aggregate' (one draw for the weighted sum, same distribution) where the
  aggregate is a plain weighted sum of the uploads: the `mean` aggregator, no
  central or local DP (whose clipping comes after the pipeline) and no
  Byzantine clients (who send something else); else 'client'."""
  if cfg.kept_noise_draw != "auto":
    return cfg.kept_noise_draw
  # the server's norm bound and an audit's canaries change uploads after the pipeline
  linear = (not mechanisms.get_mechanism(cfg.dp).private and cfg.aggregator == "mean"
            and cfg.byzantine_fraction == 0
            and cfg.server_clip_l2 is None and cfg.audit_canaries == 0)
  return "aggregate" if linear else "client"
