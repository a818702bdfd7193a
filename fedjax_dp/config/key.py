"""A config key as one row (config/keys.py holds them all): what Config, the
checks and the reference are derived from."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key.

  choices: its allowed values (None: any value of its type; (): a registry's names,
    checked at the edge). at_least / above / at_most / below: its range (inclusive /
    exclusive ends). nullable: it may be null; the type of its value when set.
  limit: a limit that involves another key (config/checks.py), shown beside the
    range; allowed: the allowed values stated by hand where the range would mislead.
  feeds: the recipe's stages it is read by, "SLOT:STAGE.ARGUMENT": for a local term
    or an aggregation rule ("term:fedprox.mu", "aggregator:krum.f") recipes.from_config
    builds the registered stage STAGE with this key's value as ARGUMENT (the
    constructor's default equals the key's); for the upload pipeline
    ("upload:topk.sparsity") the argument of compression/pipeline's constructor
    ("upload:gaussian_on_kept": a setting of the kept noise); "SLOT:*" a setting of
    whichever stage fills the slot (the mechanism, its planner, adaptive clipping,
    budgets, the server optimizer, the shuffler). A key that feeds nothing is the
    set-up's (data, population, local training, execution; recipes.SETUP_KEYS).
  data: its value is data to the compiled round (recipes/hparams.numeric_keys: a sweep
    or with_hparams changes it without recompiling); a term's or rule's number is
    data by its feed.
  section: the reference's section (set by `section`).
  """
  name: str
  default: Any
  meaning: str
  choices: tuple[str, ...] | None = None
  at_least: float | None = None
  above: float | None = None
  at_most: float | None = None
  below: float | None = None
  nullable: type | None = None
  limit: str = ""
  allowed: str = ""
  feeds: tuple[str, ...] = ()
  data: bool = False
  section: str = ""

  @property
  def bounds(self) -> tuple[float | None, float | None, bool, bool] | None:
    """(low, high, low inclusive, high inclusive), None ends unbounded; None: no range."""
    lo = self.above if self.at_least is None else self.at_least
    hi = self.below if self.at_most is None else self.at_most
    if lo is None and hi is None:
      return None
    return lo, hi, self.at_least is not None, self.below is None

  @property
  def annotation(self) -> Any:
    """The field's type: float | None, tuple[int, ...], str, ..."""
    if self.nullable is not None:
      return self.nullable | None
    if isinstance(self.default, tuple):
      return tuple[type(self.default[0]) if self.default else str, ...]
    return type(self.default)


def section(title: str, keys: list[Key]) -> tuple[Key, ...]:
  """The keys of one section of the reference, each marked with it."""
  return tuple(dataclasses.replace(k, section=title) for k in keys)
