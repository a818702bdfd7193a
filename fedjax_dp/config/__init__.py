"""Run configuration: one flat, validated dataclass.

A config comes from defaults, then an optional YAML file, then `--set key=value`
overrides. Each key is checked once, so that a bad value fails before any data is
loaded or anything is written, with a one-line message naming the key, the value
and what is allowed: on its own and against the population here (checks.py), and
against the run's stages at the edge (fedjax_dp.make_config and load_config,
recipes/config_checks.py). config/ imports nothing of the package but errors.py.

The package holds, one concept a module:

  key.py      Key: one config key as a row (default, meaning, choices, bounds, null)
  keys.py     every key's row, by section: the one place a key is declared
  schema.py   what the rows derive: the Config dataclass, CHOICES, RANGES; PRESETS
  checks.py   the checks a Config passes on its own (keys, population, a stage's numbers)
  loading.py  coercion of raw values, parse_config, parse_set, read_config_file
  plugin_keys.py  register_key: a plugin's own key row (its stage's number as a key)
"""

# every name an importer reads through fedjax_dp.config (_coerce: recipes/base.py)
from fedjax_dp.config.key import Key
from fedjax_dp.config.loading import _coerce, parse_config, parse_set, read_config_file
from fedjax_dp.config.plugin_keys import register_key
from fedjax_dp.config.schema import (CHOICES, FLOAT32_MAX, MIN_NOISE_MULTIPLIER,
                                     PLD_MIN_NOISE_MULTIPLIER, PRESETS, RANGES, Config)
from fedjax_dp.errors import ConfigError

# moved by issue 40 (config/ checks each key on its own; the run's stages are checked at
# the edge): an import of the old name says where it went
_MOVED = {"make_config": "fedjax_dp.make_config", "load_config": "fedjax_dp.load_config",
          "unread_keys": "fedjax_dp.recipes.config_checks.unread_keys"}


def __getattr__(name: str):
  if name in _MOVED:
    raise ImportError(f"fedjax_dp.config.{name} moved: use {_MOVED[name]} (it checks the "
                      "run's stages too; config.parse_config checks each key on its own)")
  raise AttributeError(f"module 'fedjax_dp.config' has no attribute {name!r}")


__all__ = ["CHOICES", "FLOAT32_MAX", "MIN_NOISE_MULTIPLIER", "PLD_MIN_NOISE_MULTIPLIER",
           "PRESETS", "RANGES", "Config", "ConfigError", "Key", "parse_config", "parse_set",
           "read_config_file", "register_key"]
