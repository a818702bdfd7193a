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
"""

# every name an importer reads through fedjax_dp.config (_coerce: recipes/base.py)
from fedjax_dp.config.loading import _coerce, parse_config, parse_set, read_config_file
from fedjax_dp.config.schema import (CHOICES, FLOAT32_MAX, MIN_NOISE_MULTIPLIER,
                                     PLD_MIN_NOISE_MULTIPLIER, PRESETS, RANGES, Config)
from fedjax_dp.errors import ConfigError

__all__ = ["CHOICES", "FLOAT32_MAX", "MIN_NOISE_MULTIPLIER", "PLD_MIN_NOISE_MULTIPLIER",
           "PRESETS", "RANGES", "Config", "ConfigError", "parse_config", "parse_set",
           "read_config_file"]
