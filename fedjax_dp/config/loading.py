"""Building a Config: raw values coerced to each key's type, defaults and an
algorithm's presets with overrides applied (parse_config), `--set key=value`
parsing (parse_set) and a YAML file's mapping (read_config_file). The run's stages
are checked at the edge (fedjax_dp.make_config, recipes/config_checks.py).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import yaml

from fedjax_dp.config.checks import check_config
from fedjax_dp.config.plugin_keys import PLUGIN_KEYS, plugin_value
from fedjax_dp.config.schema import _FIELDS, _OPTIONAL, PRESETS, Config, config_of
from fedjax_dp.errors import ConfigError


def _coerce(key: str, value: Any) -> Any:
  """Converts one raw value to the field's type, or raises ConfigError."""
  default = getattr(Config(), key)
  if key == "hidden":
    if isinstance(value, int) and not isinstance(value, bool):
      value = [value]
    if isinstance(value, str):
      value = [v for v in value.replace(",", " ").split() if v]
    try:
      sizes = tuple(int(v) for v in value)
      if any(isinstance(v, bool) or (isinstance(v, float) and v != int(v)) for v in value):
        raise ValueError("not whole")   # int(1.5) would quietly be 1
    except (TypeError, ValueError):
      raise ConfigError(
          f"config key 'hidden' = {value!r}: expected a list of positive layer sizes, e.g. [200, 200]")
    if not sizes or any(s < 1 for s in sizes):
      raise ConfigError(
          f"config key 'hidden' = {value!r}: expected a non-empty list of sizes >= 1")
    return sizes
  if key == "tier_noise_multipliers":
    if isinstance(value, str):
      value = [v for v in value.strip("[]").replace(",", " ").split() if v]
    try:
      mults = tuple(float(v) for v in value)
    except (TypeError, ValueError):
      mults = ()
    if len(mults) != 5 or any(not (m > 0 and math.isfinite(m)) for m in mults):
      raise ConfigError(f"config key 'tier_noise_multipliers' = {value!r}: expected 5 positive "
                        "numbers, for the tiers high, medium, low, public, metadata")
    return mults
  if key == "plugins":
    if isinstance(value, str):
      value = [v for v in value.strip("[]").replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
      raise ConfigError(f"config key 'plugins' = {value!r}: expected a list of Python files "
                        "or module names, e.g. [my_rule.py]")
    return tuple(value)
  if key == "client_sizes" and value is not None:
    if isinstance(value, str):
      value = [v for v in value.strip("[]").replace(",", " ").split() if v]
    try:
      sizes = tuple(int(v) for v in value)
      if any(isinstance(v, bool) or (isinstance(v, float) and v != int(v)) for v in value):
        raise ValueError("not whole")   # int(1.5) would quietly be 1
    except (TypeError, ValueError):
      raise ConfigError(f"config key 'client_sizes' = {value!r}: expected a list of client "
                        "sizes, e.g. [100, 200, 300]")
    return sizes
  if value is None:
    if key in _OPTIONAL:
      return None
    raise ConfigError(f"config key '{key}' = null: a value is required")
  if isinstance(default, bool):
    if not isinstance(value, bool):
      raise ConfigError(f"config key '{key}' = {value!r}: expected true or false")
    return value
  kind = _OPTIONAL.get(key, type(default))
  if kind is int:
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
      raise ConfigError(f"config key '{key}' = {value!r}: expected an integer")
    return int(value)
  if kind is float:
    if isinstance(value, str):  # YAML 1.1 reads `1e-2` (no dot) as a string
      try:
        value = float(value)
      except ValueError:
        pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"config key '{key}' = {value!r}: expected a number")
    if not math.isfinite(value):
      raise ConfigError(f"config key '{key}' = {value!r}: expected a finite number")
    return float(value)
  # strings (and optional strings)
  if not isinstance(value, str):
    raise ConfigError(f"config key '{key}' = {value!r}: expected a string")
  return value


def parse_config(overrides: dict[str, Any] | None = None, base: Config | None = None) -> Config:
  """Returns `base` (or the defaults) with `overrides` applied, each key and the
  population checked (checks.check_config). An algorithm's PRESETS fill the keys
  `overrides` leave out, on the defaults or when `overrides` names the algorithm; a
  `base` (a saved, resolved config) keeps its own values (a resumed topksdp run with
  s_global 0 stays at 0). The run's stages are not checked here: fedjax_dp.make_config
  does both."""
  values = (base or Config()).to_dict()
  raw = dict(overrides or {})
  algorithm = str(raw.get("algorithm", values["algorithm"]))
  for name, preset in PRESETS.items():
    if name in [a.strip() for a in algorithm.split("+")] and (base is None
                                                               or "algorithm" in raw):
      values.update({k: v for k, v in preset.items() if k not in raw})
  for key, value in raw.items():
    if key in PLUGIN_KEYS:      # a plugin's key (config/plugin_keys.py)
      values[key] = plugin_value(key, value)
    elif key not in _FIELDS:
      raise ConfigError(unknown_key_message(key))
    else:
      values[key] = _coerce(key, value)
  values["hidden"] = tuple(values["hidden"])
  values["tier_noise_multipliers"] = tuple(values["tier_noise_multipliers"])
  values["plugins"] = tuple(values["plugins"])
  cfg = config_of(values)   # (base's plugin keys are flat in its to_dict, as raw's)
  check_config(cfg, raw)
  return cfg


def unknown_key_message(key: str) -> str:
  """One line: the unknown key, the nearest known ones, and where the list is."""
  near = difflib.get_close_matches(str(key), [*_FIELDS, *PLUGIN_KEYS], n=3, cutoff=0.6)
  hint = f"did you mean {' or '.join(repr(k) for k in near)}? " if near else ""
  return (f"unknown config key '{key}' ({hint}`fedjax-dp config` lists all {len(_FIELDS)}, "
          "with their defaults and allowed values)")


def parse_set(items: list[str]) -> dict[str, Any]:
  """Parses `key=value` strings; values are read as YAML scalars or lists."""
  out: dict[str, Any] = {}
  for item in items:
    if "=" not in item:
      raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    try:
      out[key] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
      out[key] = raw
  return out


def read_config_file(path: str) -> dict[str, Any]:
  """The mapping of key: value in the YAML file at `path` ({} for an empty file)."""
  try:
    with open(path) as f:
      loaded = yaml.safe_load(f)
  except FileNotFoundError:
    raise ConfigError(f"config file {path!r} does not exist")
  except IsADirectoryError:
    raise ConfigError(f"config file {path!r} is a folder: name a YAML file")
  except UnicodeDecodeError:
    raise ConfigError(f"config file {path!r} is not UTF-8 text: name a YAML file")
  except OSError as e:
    raise ConfigError(f"config file {path!r} cannot be read ({e.strerror})")
  except yaml.YAMLError as e:
    line = getattr(getattr(e, "problem_mark", None), "line", None)
    where = f" (line {line + 1})" if line is not None else ""
    raise ConfigError(f"config file {path!r} is not valid YAML{where}")
  if loaded is None:
    loaded = {}
  if not isinstance(loaded, dict):
    raise ConfigError(f"config file {path!r}: expected a mapping of key: value")
  return loaded
