"""The checks a Config passes on its own, before anything runs: each key (a choice,
a range), the keys against the population and its sampling, and the numbers a stage
needs. Each raises ConfigError with one line naming the key, the value as the user
wrote it and what is allowed. The checks that need the package's stages and
registries are recipes/config_checks.py's (config/ imports nothing of the package).
"""

from __future__ import annotations

from typing import Any

from fedjax_dp.config.schema import (CHOICES, FLOAT32_MAX, MIN_NOISE_MULTIPLIER,
                                     PLD_MIN_NOISE_MULTIPLIER, RANGES, Config)
from fedjax_dp.errors import ConfigError


def _describe_range(key: str) -> str:
  lo, hi, lo_inc, hi_inc = RANGES[key]
  show = lambda v: str(v) if isinstance(v, int) else f"{v:g}"   # 2147483647, not 2.14748e+09
  parts = []
  if lo is not None:
    parts.append(f"{'>=' if lo_inc else '>'} {show(lo)}")
  if hi is not None:
    parts.append(f"{'<=' if hi_inc else '<'} {show(hi)}")
  return " and ".join(parts)


def check_config(cfg: Config, raw: dict[str, Any]) -> None:
  """Raises ConfigError for the first bad value, shown as the user wrote it (`raw`):
  each key's own values, the set-up's (population, sampling, Byzantine clients) and
  the numbers a stage needs whatever the run's stages are. What needs the package's
  registries and stages (the aggregator's name, which stages combine, the data, a key
  nothing of the run reads) is recipes.config_checks.check_run's, called at the edge
  by fedjax_dp.make_config."""
  _check_keys(cfg, raw)
  _check_population(cfg, raw)
  _check_stage_numbers(cfg)


def _check_keys(cfg: Config, raw: dict[str, Any]) -> None:
  """Each key on its own: a choice among its values, a number in its range."""
  for key, choices in CHOICES.items():
    value = getattr(cfg, key)
    if not choices:   # a registry's names (aggregator): recipes.config_checks
      continue
    if value not in choices:
      raise ConfigError(
          f"config key '{key}' = {value!r}: allowed values are {', '.join(choices)}")
  for key in RANGES:
    value = getattr(cfg, key)
    if value is None:
      continue
    lo, hi, lo_inc, hi_inc = RANGES[key]
    ok = True
    if lo is not None:
      ok &= value >= lo if lo_inc else value > lo
    if hi is not None:
      ok &= value <= hi if hi_inc else value < hi
    if not ok:
      raise ConfigError(f"config key '{key}' = {raw.get(key, value)!r}: must be "
                        f"{_describe_range(key)}")
  if cfg.byzantine_scale > FLOAT32_MAX:
    raise ConfigError(f"config key 'byzantine_scale' = {cfg.byzantine_scale:g}: above float32's "
                      "largest value (3.4e38)")


def _check_population(cfg: Config, raw: dict[str, Any]) -> None:
  """Keys against the population and its sampling (num_clients, clients_per_round)."""
  if cfg.clients_per_round > cfg.num_clients:
    raise ConfigError(
        f"config key 'clients_per_round' = {cfg.clients_per_round}: must be <= num_clients "
        f"({cfg.num_clients})")
  if cfg.max_cohort is not None and cfg.max_cohort < cfg.clients_per_round:
    raise ConfigError(
        f"config key 'max_cohort' = {cfg.max_cohort}: must be >= clients_per_round "
        f"({cfg.clients_per_round})")
  if cfg.lr_min > cfg.lr:
    raise ConfigError(f"config key 'lr_min' = {cfg.lr_min}: must be <= lr ({cfg.lr})")
  if cfg.server_lr_min > cfg.server_lr:
    raise ConfigError(f"config key 'server_lr_min' = {cfg.server_lr_min}: must be <= server_lr "
                      f"({cfg.server_lr})")
  if cfg.audit_canaries >= cfg.num_clients:
    raise ConfigError(f"config key 'audit_canaries' = {cfg.audit_canaries}: must be below "
                      f"num_clients ({cfg.num_clients})")
  if cfg.audit_canaries > 0 and cfg.byzantine_fraction > 0:
    raise ConfigError(f"config key 'audit_canaries' = {cfg.audit_canaries} with "
                      f"byzantine_fraction {cfg.byzantine_fraction:g}: an audit's canaries and "
                      "Byzantine clients would overlap; audit without attackers")
  if cfg.byzantine_fraction > 0 and int(cfg.byzantine_fraction * cfg.num_clients + 1e-9) == 0:
    raise ConfigError(f"config key 'byzantine_fraction' = {cfg.byzantine_fraction:g}: of "
                      f"{cfg.num_clients} clients that is no malicious client (floor of "
                      f"fraction x num_clients); at least {1 / cfg.num_clients:g}")
  if cfg.algorithm == "solo" and (cfg.server_clip_l2 is not None or cfg.audit_canaries or (
      cfg.byzantine_fraction > 0 and cfg.byzantine_attack in ("label_flip", "targeted",
                                                              "backdoor"))):
    key = ("server_clip_l2" if cfg.server_clip_l2 is not None else
           "audit_canaries" if cfg.audit_canaries else "byzantine_attack")
    raise ConfigError(f"config key {key!r} = {getattr(cfg, key)!r} with algorithm 'solo': "
                      "SOLO trains no global model, so nothing aggregates, audits or "
                      "measures it")


def _check_stage_numbers(cfg: Config) -> None:
  """The numbers a stage needs, whichever stages the run has."""
  if cfg.noise_multiplier is not None and 0 < cfg.noise_multiplier < MIN_NOISE_MULTIPLIER:
    raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g}: must be 0 (no "
                      f"noise) or >= {MIN_NOISE_MULTIPLIER:g} (below it the accountant's "
                      "arithmetic overflows; any such run has no meaningful epsilon)")
