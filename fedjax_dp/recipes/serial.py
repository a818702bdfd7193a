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
from fedjax_dp.recipes.base import _DEFAULTS, Recipe, _name

FORMAT = 1


def _slots(recipe: Recipe) -> list[tuple[str, Any]]:
  """Recipe.slots() but the weighted mean (what a recipe without an aggregator has)."""
  return [(slot, c) for slot, c in recipe.slots()
          if (slot, _name(c.stage)) != ("aggregator", "mean")]


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
  """The recipe `to_dict` wrote. ValueError in one line for data of another shape or
  format, one argument given two values, or stages that are not what their names
  and arguments build: another stage, an argument its stage does not take or
  changes, an `unused` key a stage reads (a plugin's stage needs its plugin)."""
  _check_shape(data)
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
  built = to_dict(recipe)
  difference = _stage_difference(built["stages"], data["stages"])
  if difference and difference != _OTHER:
    raise ValueError(f"recipe {data['name']!r}: {difference}")
  if difference or built.get("unused", {}) != data.get("unused", {}):
    raise ValueError(f"recipe {data['name']!r}: its stages {_names(data['stages'])} are not "
                     f"what their names and arguments build {_names(built['stages'])}, or an "
                     "argument is not its stage's (is a plugin's stage not imported?)")
  return recipe


def _check_shape(data) -> None:
  ok = (isinstance(data, dict) and data.get("format") == FORMAT
        and isinstance(data.get("name"), str) and isinstance(data.get("algorithm"), str)
        and isinstance(data.get("stages"), list)
        and all(isinstance(s, dict) and {"slot", "stage", "args"} <= set(s)
                and isinstance(s["args"], dict) for s in data["stages"])
        and isinstance(data.get("unused", {}), dict))
  if not ok:
    raise ValueError(f"recipe data: expected recipes.to_dict's (format {FORMAT}: name, "
                     "algorithm, stages of slot, stage and args), got "
                     f"{str(data)[:80]!r}")


def _stages(stages: list[dict]) -> list[dict]:
  """The stages as a recipe runs them: a static noise planner is none."""
  return [s for s in stages if (s["slot"], s["stage"]) != ("planner", "static")]


_OTHER = "another stage or argument"   # _stage_difference's answer without a finer one


def _stage_difference(built: list[dict], saved: list[dict]) -> str | None:
  """Why the saved stages are not those built from their arguments, or None. A saved
  argument the built stage does not stand for is allowed at its config default (data
  written when the stage kept it, before a kept-noise calibration said what it reads:
  010ae43); away from it, the stage would not read it."""
  built, saved = _stages(built), _stages(saved)
  if _names(built) != _names(saved):
    return _OTHER
  for b, s in zip(built, saved):
    for k, v in s["args"].items():
      if k not in b["args"] and k in _FIELDS and _coerce(k, v) != _DEFAULTS[k]:
        return f"argument {k!r} = {v!r} is read by no stage of it ({s['stage']!r} does not read it)"
      if k not in b["args"] and k not in _FIELDS:
        return _OTHER
    if {k: v for k, v in s["args"].items() if k in b["args"]} != b["args"]:
      return _OTHER
  return None


def _names(stages: list[dict]) -> list[tuple[str, str]]:
  return [(s["slot"], s["stage"]) for s in _stages(stages)]
