"""A sweep file: a base config, a grid and/or a list of variants, and seeds -> cells.

    # sweep.yaml
    base: demo.yaml          # a config file (relative to this file), optional
    config:                  # config keys on top of it, optional
      rounds: 30
    seeds: 4                 # n (seeds 0..n-1) or a list [0, 7, 9]; default: the base's seed
    grid:                    # every combination of these values
      lr: [0.02, 0.05]
    variants:                # and/or a list of settings, each crossed with the grid
      - {algorithm: fedavg}
      - {algorithm: fedprox, prox_mu: 0.01}
    replica_batch: auto      # replicas vmapped together (sweeps/run.py); auto, or n >= 1

A cell is base + config + one variant + one grid point + one seed. A sweep's
seeds share one data split and partition: each cell's `data_seed` is the base's
(its `data_seed`, else its `seed`), unless a variant or the grid sets it, so
seeds differ in the seed alone (model initialisation, cohorts, local training,
noise); every cell's run key also folds in its settings, so cells of one seed
draw their own cohorts and noise (recipes/release_identity.py). A cell's name is the keys it sets (its variant's, its grid
point's, its seed), `key=value` joined by ',' (e.g. `lr=0.05,seed=1`); it names
its run folder, so a sweep extended with more seeds or values finds the cells it
already ran under their old names.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
from typing import Any

import yaml

from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError, DataError
from fedjax_dp.experiment.setup import check_config_test_source
from fedjax_dp.recipes.config_checks import load_config, make_config
from fedjax_dp.recipes.kept_noise_check import check_kept_noise

SWEEP_KEYS = ("base", "config", "seeds", "grid", "variants", "replica_batch")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of a sweep: its name (its folder under cells/), the keys it sets on
  the base ({key: value}, seed included) and its checked config."""
  name: str
  values: dict
  cfg: Config


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """A sweep, as its file says (see the module docstring); `base` is the base
  config's values (file, then config:, then --set), checked."""
  base: dict
  seeds: tuple[int, ...] | None = None
  grid: dict = dataclasses.field(default_factory=dict)
  variants: tuple[dict, ...] = ()
  replica_batch: int | str = "auto"

  def to_dict(self) -> dict:
    return {"base": self.base, "seeds": list(self.seeds) if self.seeds else None,
            "grid": self.grid, "variants": list(self.variants),
            "replica_batch": self.replica_batch}

  def cells(self) -> list[Cell]:
    """Every cell in order: variants, then grid points, then seeds, outermost first.
    ConfigError (one line, naming the cell) for a cell whose config is refused,
    and for two cells that are the same run; DataError for a cell whose guarantee
    its dataset's test split would break (setup.check_config_test_source)."""
    seeds = self.seeds or (self._base_seeds()[0],)
    grid_points = [dict(zip(self.grid, values))
                   for values in itertools.product(*self.grid.values())]
    assigned = [{**variant, **point, "seed": seed}
                for variant in (self.variants or ({},)) for point in grid_points
                for seed in seeds]
    named = self.named_keys()
    cells, seen = [], {}
    for values in assigned:
      name = ",".join(f"{k}={_shown(values[k])}" for k in named if k in values)
      pinned = {"data_seed": self._base_seeds()[1]} if "data_seed" not in values else {}
      try:
        cfg = make_config({**self.base, **pinned, **values})
        check_kept_noise(cfg)   # on its grid: before any cell runs (its sizes: at its set-up)
        check_config_test_source(cfg)   # a guarantee tested on its writers' own rows
      except (ConfigError, DataError) as e:
        raise type(e)(f"sweep cell {name!r}: {e}") from None
      if cfg in seen:
        raise ConfigError(f"sweep cells {seen[cfg]!r} and {name!r} are the same run (a key of "
                          "theirs changes nothing): drop one")
      if name in seen.values():
        raise ConfigError(f"sweep cells share the name {name!r}: give their values distinct "
                          "spellings")
      seen[cfg] = name
      cells.append(Cell(name=name, values=values, cfg=cfg))
    return cells

  def named_keys(self) -> list[str]:
    """The keys that name the cells (and are the tidy table's columns): every
    variant's (in order of first appearance), the grid's, then seed. A cell is
    named by all of them it sets, varied or not, so that adding seeds or values
    later names the cells already run as before (they are kept, not run again)."""
    return list(dict.fromkeys([k for v in self.variants for k in v] + list(self.grid)
                              + ["seed"]))

  def _base_seeds(self) -> tuple[int, int]:
    """(the base's seed, the seed of its data: data_seed, else seed), as make_config
    would read them (the base alone need not be a whole run's config)."""
    seed = self.base.get("seed", Config().seed)
    data = self.base.get("data_seed")
    try:
      return int(seed), int(seed if data is None else data)
    except (TypeError, ValueError):
      raise ConfigError(f"sweep base: seed {seed!r} / data_seed {data!r}: expected integers") \
          from None


def _shown(value: Any) -> str:
  """A value as a folder name can hold it: lists joined by '-', no '/' or spaces."""
  if isinstance(value, (list, tuple)):
    text = "-".join(_shown(v) for v in value)
  elif isinstance(value, float):
    text = repr(value)
  else:
    text = "null" if value is None else str(value)
  return text.replace("/", "_").replace(" ", "_")


def load_sweep(path_or_dict, sets: list[str] | None = None) -> SweepSpec:
  """The SweepSpec of a sweep file (path) or of its contents (dict); `sets`
  (--set KEY=VALUE) apply to the base config. ConfigError (one line) for a bad
  file, key or value."""
  where = "sweep"
  folder = os.getcwd()
  if isinstance(path_or_dict, dict):
    raw = dict(path_or_dict)
  else:
    where = f"sweep file {str(path_or_dict)!r}"
    raw = _read_yaml(path_or_dict, where)
    folder = os.path.dirname(os.path.abspath(path_or_dict))
  for key in raw:
    if key not in SWEEP_KEYS:
      near = difflib.get_close_matches(str(key), SWEEP_KEYS, n=1)
      hint = f"did you mean {near[0]!r}? " if near else ""
      raise ConfigError(f"{where}: unknown key {key!r} ({hint}allowed are "
                        f"{', '.join(SWEEP_KEYS)}; config keys go under config:)")
  base = {}
  if raw.get("base") is not None:
    if not isinstance(raw["base"], str):
      raise ConfigError(f"{where}: base = {raw['base']!r}: expected the path of a config file")
    base = _given(os.path.join(folder, raw["base"]))   # an absolute path stays as it is
  config = raw.get("config") or {}
  if not isinstance(config, dict):
    raise ConfigError(f"{where}: config = {config!r}: expected a mapping of config keys")
  base.update(config)
  from fedjax_dp.config import parse_set
  base.update(parse_set(sets or []))
  grid = raw.get("grid") or {}
  if not isinstance(grid, dict):
    raise ConfigError(f"{where}: grid = {grid!r}: expected a mapping of config key: [values]")
  for key, values in grid.items():
    if not isinstance(values, list) or not values:
      raise ConfigError(f"{where}: grid key {key!r} = {values!r}: expected a non-empty list of "
                        "values")
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
      raise ConfigError(f"{where}: grid key {key!r} lists {twice[0]!r} twice")
  variants = raw.get("variants") or []
  if not isinstance(variants, list) or not all(isinstance(v, dict) and v for v in variants):
    raise ConfigError(f"{where}: variants = {variants!r}: expected a list of non-empty "
                      "mappings of config keys")
  for key in list(grid) + [k for v in variants for k in v]:
    if not isinstance(key, str):
      raise ConfigError(f"{where}: {key!r} in grid or variants: expected a config key name")
    if key == "seed":
      raise ConfigError(f"{where}: 'seed' in grid or variants: list seeds under seeds:")
    if key in grid and any(key in v for v in variants):
      raise ConfigError(f"{where}: config key {key!r} is in both grid and variants: keep it in "
                        "one")
  return SweepSpec(base=base, seeds=_seeds(raw.get("seeds"), where),
                   grid={k: list(v) for k, v in grid.items()},
                   variants=tuple(dict(v) for v in variants),
                   replica_batch=replica_batch_value(raw.get("replica_batch", "auto"), where))


def _given(path: str) -> dict:
  """The keys a config file sets (not the defaults it leaves): the base of a sweep."""
  raw = _read_yaml(path, f"config file {path!r}")
  load_config(path)   # checked as a run would check it
  return dict(raw)


def _read_yaml(path, where: str) -> dict:
  try:
    with open(path) as f:
      loaded = yaml.safe_load(f)
  except FileNotFoundError:
    raise ConfigError(f"{where} does not exist") from None
  except IsADirectoryError:
    raise ConfigError(f"{where} is a folder: name a YAML file") from None
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"{where} cannot be read ({getattr(e, 'strerror', None) or e})") from None
  except yaml.YAMLError as e:
    line = getattr(getattr(e, "problem_mark", None), "line", None)
    raise ConfigError(f"{where} is not valid YAML"
                      + (f" (line {line + 1})" if line is not None else "")) from None
  if loaded is None:
    return {}
  if not isinstance(loaded, dict):
    raise ConfigError(f"{where}: expected a mapping of key: value")
  return loaded


def _seeds(value, where: str) -> tuple[int, ...] | None:
  """seeds: n (0..n-1) or a list of distinct seeds; None: the base's seed."""
  if value is None:
    return None
  ok_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
  if ok_int(value) and value >= 1:
    return tuple(range(value))
  if isinstance(value, list) and value and all(ok_int(v) and 0 <= v < 2**31 for v in value) \
      and len(set(value)) == len(value):
    return tuple(value)
  raise ConfigError(f"{where}: seeds = {value!r}: expected a count n >= 1 (seeds 0..n-1) or a "
                    "list of distinct seeds in 0..2147483647")


def replica_batch_value(value, where: str = "sweep") -> int | str:
  """replica_batch: 'auto' or an integer >= 1."""
  if value == "auto":
    return value
  if isinstance(value, str) and value.isdigit():
    value = int(value)
  if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
    return value
  raise ConfigError(f"{where}: replica_batch = {value!r}: expected auto or an integer >= 1")
