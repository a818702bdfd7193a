"""Config keys a plugin registers: a row like config/keys.py's, for a stage of the
plugin's own, so that its number is a key of the CLI, YAML, config.json, sweeps
and with_hparams like a built-in stage's.

    # my_term.py (listed in the config's `plugins`)
    register_term(my_prox)                          # def my_prox(mu=0.01) -> LocalTerm
    register_key(Key("my_prox_mu", 0.01, "my_prox's weight", at_least=0.0,
                     feeds=("term:my_prox.mu",)))

A Config holds the values of such keys that differ from their defaults in its
`plugin_values` field, and reads them as attributes (cfg.my_prox_mu); `to_dict`
writes them as flat keys (config.json), and a key left at its default is not
written, so a config's identity does not depend on which plugins the process has
imported. Each key feeds a stage argument (the constructor's default equals the
key's) and takes a number, a string or true/false.
"""

from __future__ import annotations

import dataclasses
import re

from fedjax_dp.config.key import Key
from fedjax_dp.errors import ConfigError

PLUGIN_KEYS: dict[str, Key] = {}
PLUGIN_FIELD = "plugin_values"   # the Config field that holds their values


_FEED = re.compile(r"(term|aggregator):[A-Za-z_]\w*\.[A-Za-z_]\w*")


def register_key(key: Key) -> None:
  """Adds `key`; ConfigError where its name is a built-in key's or an attribute of
  Config, another row has the name, a feed is not 'term:STAGE.ARG' or
  'aggregator:STAGE.ARG' or is already fed by another key (built-in or a plugin's:
  one stage argument, one key), or its type is not a number, a string or a boolean.
  Registering the same row again (a plugin imported twice) changes nothing."""
  from fedjax_dp.config.keys import KEYS
  from fedjax_dp.config.schema import _FIELDS, Config   # (schema imports this module)
  name = key.name
  if name in _FIELDS or name == PLUGIN_FIELD:
    raise ConfigError(f"register_key: {name!r} is a built-in config key; name the plugin's "
                      "key after its stage (e.g. 'my_prox_mu')")
  if not name.isidentifier() or name.startswith("_") or hasattr(Config, name):
    raise ConfigError(f"register_key: {name!r} is not a key name (letters, digits and _, "
                      "not starting with _, not a Config method)")
  if not key.feeds:
    raise ConfigError(f"register_key: {name!r} feeds no stage argument; give feeds="
                      "('term:STAGE.ARG',) or ('aggregator:STAGE.ARG',)")
  fed = {feed: k.name for k in (*KEYS, *PLUGIN_KEYS.values()) if k.name != name
         for feed in k.feeds}
  for feed in key.feeds:
    if not _FEED.fullmatch(feed):
      raise ConfigError(f"register_key: {name!r} feeds {feed!r}; expected 'term:STAGE.ARG' "
                        "or 'aggregator:STAGE.ARG'")
    if feed in fed:
      raise ConfigError(f"register_key: {name!r} feeds {feed!r}, which config key "
                        f"{fed[feed]!r} already feeds (one stage argument, one key)")
  if type(key.default) not in (int, float, str, bool) or key.nullable is not None:
    raise ConfigError(f"register_key: {name!r} has default {key.default!r}; a plugin's key "
                      "takes a number, a string or true/false")
  row = dataclasses.replace(key, section=key.section or "Plugins")
  if name in PLUGIN_KEYS and PLUGIN_KEYS[name] != row:
    raise ConfigError(f"register_key: {name!r} is already registered with another row")
  PLUGIN_KEYS[name] = row


def plugin_value(name: str, value):
  """`value` of the registered key `name` checked against its row (type, choices,
  range) and converted to its type; ConfigError in one line otherwise."""
  if name not in PLUGIN_KEYS:
    raise ConfigError(f"unknown config key '{name}' (a plugin's key: list the plugin that "
                      "registers it in 'plugins')")
  key = PLUGIN_KEYS[name]
  kind = type(key.default)
  if kind is float and isinstance(value, str):   # YAML 1.1 reads `1e-6` (no dot) as text
    try:
      value = float(value)
    except ValueError:
      pass
  if kind is bool:
    ok = isinstance(value, bool)
  elif kind is int:
    ok = not isinstance(value, bool) and (isinstance(value, int) or (
        isinstance(value, float) and value.is_integer()))
  elif kind is float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and \
        value == value and abs(value) != float("inf")
  else:
    ok = isinstance(value, str)
  if not ok:
    raise ConfigError(f"config key '{name}' = {value!r}: expected "
                      f"{ {bool: 'true or false', int: 'an integer', float: 'a finite number'}.get(kind, 'a string')}")
  value = kind(value)
  if key.choices and value not in key.choices:
    raise ConfigError(f"config key '{name}' = {value!r}: allowed values are "
                      f"{', '.join(map(str, key.choices))}")
  if key.bounds is not None:
    lo, hi, lo_inc, hi_inc = key.bounds
    if (lo is not None and not (value >= lo if lo_inc else value > lo)) or (
        hi is not None and not (value <= hi if hi_inc else value < hi)):
      ends = [f"{'>=' if lo_inc else '>'} {lo:g}"] if lo is not None else []
      ends += [f"{'<=' if hi_inc else '<'} {hi:g}"] if hi is not None else []
      raise ConfigError(f"config key '{name}' = {value!r}: must be {' and '.join(ends)}")
  return value


def normalised(values: dict) -> tuple:
  """The Config's plugin_values: the (name, value) pairs away from their defaults,
  sorted by name."""
  return tuple(sorted((k, v) for k, v in values.items() if v != PLUGIN_KEYS[k].default))
