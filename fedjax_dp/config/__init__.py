"""Run configuration: one flat, validated dataclass.

A config comes from defaults, then an optional YAML file, then `--set key=value`
overrides. Every key is checked once, in checks.py, so that a bad value fails before
any data is loaded or anything is written, with a one-line message naming the
key, the value and what is allowed.

The package holds, one concept a module:

  schema.py   the Config dataclass, its keys' choices and ranges, PRESETS
  checks.py   the checks a built Config passes (keys, population, stages, data)
  loading.py  coercion of raw values, make_config, parse_set, load_config
"""

# every name an importer reads through fedjax_dp.config (_coerce: recipes/base.py)
from fedjax_dp.config.checks import unread_keys
from fedjax_dp.config.loading import _coerce, load_config, make_config, parse_set
from fedjax_dp.config.schema import (CHOICES, FLOAT32_MAX, MIN_NOISE_MULTIPLIER, PRESETS, RANGES,
                                     Config)
from fedjax_dp.errors import ConfigError

__all__ = ["CHOICES", "FLOAT32_MAX", "MIN_NOISE_MULTIPLIER", "PRESETS", "RANGES", "Config",
           "ConfigError", "load_config", "make_config", "parse_set", "unread_keys"]
