"""What a run configuration is, derived from its keys' rows (config/keys.py): the
Config dataclass, each key's allowed values (CHOICES) and range (RANGES), the
optional keys; and the defaults an algorithm brings (PRESETS). No checking here
(config/checks.py) and no parsing (config/loading.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fedjax_dp.config.keys import KEYS
from fedjax_dp.config.plugin_keys import PLUGIN_FIELD, PLUGIN_KEYS, normalised, plugin_value
from fedjax_dp.errors import ConfigError  # noqa: F401  (its old home; callers import it from here)


MIN_NOISE_MULTIPLIER = 1e-6   # 1e-300 overflowed the RDP arithmetic
# Below this, dp-accounting's PLD discretises a privacy-loss range of about 1 / (2 z^2)
# in steps of 1e-4: z = 1e-3 asked for 38 GiB and failed after a whole run's training.
PLD_MIN_NOISE_MULTIPLIER = 0.01
FLOAT32_MAX = 3.4028234663852886e38


def data_seed(cfg: "Config") -> int:
  """The seed of the data: its split or generation, the partition over clients, which
  clients are Byzantine and the analyzer's networks (data_seed; null: seed). The model's
  initialisation is always seed's; the run key (cohorts, local training, noise) is
  seed's with the release's settings and inputs folded in (recipes/release_identity.py)."""
  return cfg.seed if cfg.data_seed is None else cfg.data_seed


def _to_dict(self) -> dict[str, Any]:
  d = dataclasses.asdict(self)
  d["hidden"] = list(self.hidden)
  d["tier_noise_multipliers"] = list(self.tier_noise_multipliers)
  d.update(d.pop(PLUGIN_FIELD))   # a plugin's keys, flat (only those away from their defaults)
  return d


def _plugin_key(self, name: str) -> Any:
  """A plugin's key (config/plugin_keys.py): its value here, else its default."""
  values = dict(self.__dict__.get(PLUGIN_FIELD, ()))
  if name in values:
    return values[name]
  if name in PLUGIN_KEYS:
    return PLUGIN_KEYS[name].default
  raise AttributeError(f"'Config' object has no attribute {name!r}")


def _to_json(self) -> str:
  return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# The run configuration: one flat, frozen dataclass with a field per row of KEYS, in
# the reference's section order (config.json is written with sorted keys), and the
# values of plugins' keys away from their defaults ((name, value) pairs by name).
Config = dataclasses.make_dataclass(
    "Config", [(k.name, k.annotation, dataclasses.field(default=k.default)) for k in KEYS]
    + [(PLUGIN_FIELD, tuple, dataclasses.field(default=()))],
    frozen=True, namespace={"to_dict": _to_dict, "to_json": _to_json, "__module__": __name__,
                            "__getattr__": _plugin_key,
                            "__doc__": "A run's configuration: config/keys.py lists its keys."})

# each key's allowed values and range: key -> (low, high, low_inclusive, high_inclusive),
# None = unbounded
CHOICES: dict[str, tuple[str, ...]] = {k.name: k.choices for k in KEYS if k.choices is not None}
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    k.name: k.bounds for k in KEYS if k.bounds is not None}

# the keys make_config accepts, and those that may be null (with their type when set)
_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != PLUGIN_FIELD}


def config_of(values: dict[str, Any]) -> "Config":
  """A Config of `values` as a plain namespace (not checked): its keys and, checked
  against their rows, registered plugins' keys."""
  plugin = {k: plugin_value(k, v) for k, v in values.items() if k not in _FIELDS}
  return Config(**{k: v for k, v in values.items() if k in _FIELDS},
                plugin_values=normalised(plugin))


_OPTIONAL = {k.name: k.nullable for k in KEYS if k.nullable is not None}

# algorithm presets: defaults a named algorithm brings, unless the user sets the key
PRESETS = {"topksdp": {"s_local": 0.9, "s_global": 0.9, "shuffle": "layerwise"}}
