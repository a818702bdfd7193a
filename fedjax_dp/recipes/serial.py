"""A recipe as plain data: each stage's registered name and its keyword arguments.

    d = recipes.to_dict(recipes.dp_fedavg(noise_multiplier=1.0))
    # {"format": 1, "name": "dp_fedavg", "algorithm": "fedavg", "stages": [
    #    {"slot": "aggregator", "stage": "mean", "args": {}},
    #    {"slot": "privacy", "stage": "central", "args": {"noise_multiplier": 1.0, ...}}, ...]}
    recipes.from_dict(json.loads(json.dumps(d)))   # the same stages and numbers

A stage's arguments are named as the building blocks of recipes.stages take them
(the config keys the stage stands for: `term("fedprox", prox_mu=0.1)`); a
plugin's stage and its registered keys (config/plugin_keys.py) serialise the
same way, and `from_dict` needs the plugin imported. Only simple types appear
(numbers, strings, booleans, null, lists), as jax-privacy's configs are "defined
in terms of simple types". The CLI's config.json stays the flat Config.
"""

from __future__ import annotations

from typing import Any

from fedjax_dp.config import _coerce
from fedjax_dp.config.schema import _FIELDS, config_of
from fedjax_dp.recipes import flat
from fedjax_dp.recipes.base import Recipe, _name

FORMAT = 1
_LISTS = ("terms", "upload", "server")
_SINGLES = ("shuffle", "aggregator", "server_optimizer", "privacy", "planner", "adaptive_clip",
            "budgets")


def _slots(recipe: Recipe) -> list[tuple[str, Any]]:
  """(slot, choice) in the recipe's order, the tuple slots first; the weighted mean
  (what a recipe without an aggregator has) is left out."""
  pairs = ([(slot, c) for slot in _LISTS for c in getattr(recipe, slot)] +
           [(slot, getattr(recipe, slot)) for slot in _SINGLES
            if getattr(recipe, slot) is not None])
  return [(slot, c) for slot, c in pairs if (slot, _name(c.stage)) != ("aggregator", "mean")]


def _stages(pairs) -> list[tuple[str, str]]:
  """(slot, name) pairs as a recipe runs them: a static noise planner is none."""
  return [p for p in pairs if p != ("planner", "static")]


def _plain(values) -> dict:
  return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def to_dict(recipe: Recipe) -> dict:
  """The recipe as JSON-ready data: its name, its algorithm's name and, per stage, the
  slot, the registered name and the keyword arguments (a stage's config keys)."""
  out = {"format": FORMAT, "name": recipe.name, "algorithm": recipe.algorithm,
         "stages": [{"slot": slot, "stage": _name(c.stage), "args": _plain(c.config)}
                    for slot, c in _slots(recipe)]}
  if recipe.unused:   # a saved run's keys no stage reads: kept so it round-trips
    out["unused"] = _plain(recipe.unused)
  return out


def from_dict(data: dict) -> Recipe:
  """The recipe `to_dict` wrote. ValueError in one line for another format, two
  stages giving one argument two values, or stages that are not what their names
  and arguments build (a plugin's stage whose plugin is not imported)."""
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError(f"recipe data: expected a dict with format {FORMAT} (recipes.to_dict), "
                     f"got {type(data).__name__} with format "
                     f"{data.get('format') if isinstance(data, dict) else None!r}")
  values: dict[str, Any] = {}
  for stage in data["stages"]:
    for key, value in stage["args"].items():
      if key in values and values[key] != value:
        raise ValueError(f"recipe {data['name']!r}: argument {key!r} is {values[key]!r} for "
                         f"one stage and {value!r} for {stage['stage']!r}")
      values[key] = value
  values.update(data.get("unused", {}), algorithm=data["algorithm"])
  values = {k: _coerce(k, v) if k in _FIELDS else v for k, v in values.items()}
  recipe = flat.from_config(config_of(values)).replace(name=data["name"])
  want = _stages((s["slot"], s["stage"]) for s in data["stages"])
  got = _stages((slot, _name(c.stage)) for slot, c in _slots(recipe))
  if got != want:
    raise ValueError(f"recipe {data['name']!r}: its stages {want} are not what their names "
                     f"and arguments build {got} (is a plugin's stage not imported?)")
  return recipe
