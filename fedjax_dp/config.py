"""Run configuration: one flat, validated dataclass.

A config comes from defaults, then an optional YAML file, then `--set key=value`
overrides. Every key is checked once, here, so that a bad value fails before
any data is loaded or anything is written, with a one-line message naming the
key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import yaml


MIN_NOISE_MULTIPLIER = 1e-6   # 1e-300 overflowed the RDP arithmetic
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(ValueError):
  """A bad config key or value; the message is one line meant for the user."""


@dataclasses.dataclass(frozen=True)
class Config:
  # data
  dataset: str = "digits"
  data_dir: str | None = None
  csv_path: str | None = None
  tier_map_path: str | None = None
  label_column: str = "label"
  synthetic_examples: int = 10000
  synthetic_features: int = 32
  synthetic_classes: int = 10
  healthcare_examples: int = 5000
  feature_scaling: str = "auto"
  # federation
  num_clients: int = 20
  clients_per_round: int = 10
  sampling: str = "fixed"
  max_cohort: int | None = None
  partition: str = "dirichlet"
  alpha: float = 0.5
  classes_per_client: int = 2
  quantity_alpha: float = 1.0
  # model
  model: str = "mlp"
  hidden: tuple[int, ...] = (200, 200)
  # local training
  local_epochs: int = 1
  batch_size: int = 64
  lr: float = 0.01
  lr_schedule: str = "constant"
  lr_min: float = 0.0
  momentum: float = 0.5
  # server
  algorithm: str = "fedavg"
  server_optimizer: str = "auto"
  prox_mu: float = 0.001
  contrastive_form: str = "bounded"
  contrastive_mu1: float = 0.01
  contrastive_mu2: float = 0.005
  contrastive_radius: float = 1.0
  contrastive_tau: float = 0.5
  moon_mu: float = 1.0
  moon_tau: float = 0.5
  admm_rho: float = 0.01
  feddyn_alpha: float = 0.01
  # update pipeline (TopkSDP-FL's SparseRandom and its variants)
  s_local: float = 0.0
  s_global: float = 0.0
  index_selection: str = "topk"
  topk_kernel: str = "exact"
  error_feedback: bool = True
  coordinate_clip: float | None = None
  update_clip_l2: float | None = None
  final_clip_l2: float | None = None
  kept_noise: str = "none"
  kept_noise_multiplier: float = 0.0
  kept_noise_draw: str = "auto"
  ldp_epsilon: float | None = None
  ldp_delta: float = 1e-5
  shuffle: str = "none"
  # aggregation and Byzantine clients
  aggregator: str = "mean"
  trim_fraction: float = 0.1
  byzantine_f: int = 0
  multi_krum_m: int = 0
  outlier_z: float = 3.5
  cluster_threshold: float = 0.5
  cluster_noise: str = "uniform"
  geomed_iters: int = 4
  geomed_eps: float = 1e-6
  cclip_tau: float = 1.0
  cclip_iters: int = 1
  byzantine_fraction: float = 0.0
  byzantine_attack: str = "sign_flip"
  byzantine_scale: float = 10.0
  server_lr: float = 1.0
  server_momentum: float = 0.9
  server_beta1: float = 0.9
  server_beta2: float = 0.99
  server_eps: float = 1e-3
  # differential privacy
  dp: str = "none"
  clip_norm: float = 1.0
  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  accountant: str = "rdp"
  clip_parts: str = "flat"
  rest_tier: str = "medium"
  tier_noise_multipliers: tuple[float, ...] = (2.0, 1.0, 0.5, 0.25, 0.1)
  tier_source: str = "given"
  noise_schedule: str = "static"
  convergence_measure: str = "update_diff"
  convergence_lambda: float = 0.1
  convergence_window: int = 10
  convergence_beta: float = 0.3
  noise_ema: float = 0.9
  client_budgets: str = "uniform"
  analyzer_rule: str = "fused"
  analyzer_steps: int = 1500
  adaptive_clipping: bool = False
  target_quantile: float = 0.5
  clip_lr: float = 0.2
  clip_count_stddev: float | None = None
  # run
  rounds: int = 50
  eval_every: int = 5
  seed: int = 0
  noise_seed: str = "config"
  checkpoint_every: int = 0
  keep_checkpoints: int = 3
  devices: int = 0
  client_parallelism: str = "auto"
  client_batch: int = 1
  eval_batch_size: int = 1000

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["hidden"] = list(self.hidden)
    d["tier_noise_multipliers"] = list(self.tier_noise_multipliers)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)


CHOICES: dict[str, tuple[str, ...]] = {
    # custom: your own data, passed to fedjax_dp.run / simulate (data.from_arrays)
    "dataset": ("digits", "mnist", "fmnist", "cifar10", "csv", "synthetic", "healthcare",
                "breast_cancer", "custom"),
    "feature_scaling": ("auto", "pooled", "per_client", "none"),
    "sampling": ("fixed", "poisson"),
    "partition": ("iid", "dirichlet", "shards", "quantity", "dirichlet_client"),
    "model": ("mlp", "cnn", "custom"),   # custom: your own (models.from_flax)
    "lr_schedule": ("constant", "cosine"),
    "server_optimizer": ("auto", "sgd", "momentum", "adam"),
    "contrastive_form": ("bounded", "moon_params"),
    "index_selection": ("topk", "random_k", "public_topk"),
    "topk_kernel": ("exact", "approx", "threshold", "bisect"),
    "noise_seed": ("config", "secret"),
    "kept_noise_draw": ("auto", "client", "aggregate"),
    "aggregator": (),   # the registered rules (fedjax_dp.robust.AGGREGATORS), read in _check
    "byzantine_attack": ("sign_flip", "scaled", "gaussian"),
    "kept_noise": ("none", "paper", "multiplier"),
    "shuffle": ("none", "layerwise"),
    "client_parallelism": ("auto", "map", "vmap"),
    "dp": ("none", "central", "local"),
    "clip_parts": ("flat", "per_layer", "tiers"),
    "rest_tier": ("high", "medium", "low", "public", "metadata"),
    "tier_source": ("given", "analyzer"),
    "noise_schedule": ("static", "convergence", "weighted"),
    "convergence_measure": ("update_diff", "norm_diff"),
    "client_budgets": ("uniform", "allocated"),
    "cluster_noise": ("uniform", "equalize"),
    "analyzer_rule": ("fused", "semantic", "statistical"),
    "accountant": ("rdp", "pld"),
}

# key -> (low, high, low_inclusive, high_inclusive); None = unbounded
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "synthetic_examples": (10, None, True, True),
    "healthcare_examples": (10, None, True, True),
    "trim_fraction": (0, 0.5, True, False),
    "byzantine_f": (0, None, True, True),
    "multi_krum_m": (0, None, True, True),
    "outlier_z": (0, None, False, True),
    "cluster_threshold": (-1, 1, True, False),
    "geomed_iters": (0, None, True, True),
    "geomed_eps": (0, None, False, True),
    "cclip_tau": (0, None, False, True),
    "cclip_iters": (1, None, True, True),
    "byzantine_fraction": (0, 1, True, False),
    "byzantine_scale": (0, None, True, True),
    "synthetic_features": (1, None, True, True),
    "synthetic_classes": (2, None, True, True),
    "num_clients": (1, None, True, True),
    "clients_per_round": (1, None, True, True),
    "max_cohort": (1, None, True, True),
    "alpha": (0, None, False, True),
    "classes_per_client": (1, None, True, True),
    "quantity_alpha": (0, None, False, True),
    "local_epochs": (1, None, True, True),
    "batch_size": (1, None, True, True),
    "lr": (0, None, False, True),
    "lr_min": (0, None, True, True),
    "momentum": (0, 1, True, False),
    "server_lr": (0, None, False, True),
    "server_momentum": (0, 1, True, False),
    "server_beta1": (0, 1, True, False),
    "server_beta2": (0, 1, True, False),
    "server_eps": (0, None, False, True),
    "clip_norm": (0, None, False, True),
    "noise_multiplier": (0, None, True, True),
    "target_epsilon": (0, None, False, True),
    "delta": (0, 1, False, False),
    "target_quantile": (0, 1, True, True),
    "prox_mu": (0, None, True, True),
    "contrastive_mu1": (0, None, True, True),
    "contrastive_mu2": (0, None, True, True),
    "contrastive_radius": (0, None, False, True),
    "contrastive_tau": (0, None, False, True),
    "moon_mu": (0, None, True, True),
    "moon_tau": (0, None, False, True),
    "admm_rho": (0, None, False, True),
    "feddyn_alpha": (0, None, False, True),
    "s_local": (0, 1, True, False),
    "s_global": (0, 1, True, False),
    "coordinate_clip": (0, None, False, True),
    "update_clip_l2": (0, None, False, True),
    "final_clip_l2": (0, None, False, True),
    "kept_noise_multiplier": (0, None, True, True),
    "ldp_epsilon": (0, None, False, True),
    "ldp_delta": (0, 1, False, False),
    "clip_lr": (0, None, False, True),
    "clip_count_stddev": (0, None, False, True),
    "rounds": (1, None, True, True),
    "analyzer_steps": (10, None, True, True),
    "convergence_lambda": (0, None, True, True),
    "convergence_window": (1, None, True, True),
    "convergence_beta": (0, 1, True, False),
    "noise_ema": (0, 1, True, False),
    "eval_every": (1, None, True, True),
    "seed": (0, 2**31 - 1, True, True),
    "checkpoint_every": (0, None, True, True),
    "keep_checkpoints": (1, None, True, True),
    "devices": (0, None, True, True),
    "client_batch": (1, None, True, True),
    "eval_batch_size": (1, None, True, True),
}

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_OPTIONAL = {"data_dir": str, "csv_path": str, "tier_map_path": str, "max_cohort": int, "noise_multiplier": float,
             "target_epsilon": float, "clip_count_stddev": float, "coordinate_clip": float,
             "update_clip_l2": float, "final_clip_l2": float, "ldp_epsilon": float}

# algorithm presets: defaults a named algorithm brings, unless the user sets the key
PRESETS = {"topksdp": {"s_local": 0.9, "s_global": 0.9, "shuffle": "layerwise"}}


def _describe_range(key: str) -> str:
  lo, hi, lo_inc, hi_inc = RANGES[key]
  show = lambda v: str(v) if isinstance(v, int) else f"{v:g}"   # 2147483647, not 2.14748e+09
  parts = []
  if lo is not None:
    parts.append(f"{'>=' if lo_inc else '>'} {show(lo)}")
  if hi is not None:
    parts.append(f"{'<=' if hi_inc else '<'} {show(hi)}")
  return " and ".join(parts)


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


def _check(cfg: Config, raw: dict[str, Any]) -> None:
  """Raises ConfigError for the first bad value, shown as the user wrote it (`raw`)."""
  def shown(key):
    return raw.get(key, getattr(cfg, key))

  for key, choices in CHOICES.items():
    value = getattr(cfg, key)
    if key == "aggregator":
      from fedjax_dp.robust import AGGREGATORS
      choices = tuple(AGGREGATORS)
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
      raise ConfigError(f"config key '{key}' = {shown(key)!r}: must be {_describe_range(key)}")
  if cfg.clients_per_round > cfg.num_clients:
    raise ConfigError(
        f"config key 'clients_per_round' = {cfg.clients_per_round}: must be <= num_clients "
        f"({cfg.num_clients})")
  # delta >= 1/N allows a mechanism that publishes a random client's data outright, and
  # the (eps, delta) conversion then reports epsilon 0 (N = 20, delta 0.3 gave 0.0)
  if cfg.dp != "none" and cfg.delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'delta' = {shown('delta')!r} with dp {cfg.dp!r}: must be < 1 / "
                      f"num_clients = {1 / cfg.num_clients:.4g} (a delta that large allows "
                      "publishing a client's data outright)")
  if cfg.kept_noise != "none" and cfg.ldp_delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'ldp_delta' = {shown('ldp_delta')!r} with kept_noise "
                      f"{cfg.kept_noise!r}: must be < 1 / num_clients = "
                      f"{1 / cfg.num_clients:.4g} (a delta that large allows publishing a "
                      "client's data outright)")
  if cfg.max_cohort is not None and cfg.max_cohort < cfg.clients_per_round:
    raise ConfigError(
        f"config key 'max_cohort' = {cfg.max_cohort}: must be >= clients_per_round "
        f"({cfg.clients_per_round})")
  if cfg.lr_min > cfg.lr:
    raise ConfigError(f"config key 'lr_min' = {cfg.lr_min}: must be <= lr ({cfg.lr})")
  if cfg.dp == "central":
    if cfg.sampling == "fixed" and cfg.accountant == "pld":
      raise ConfigError("config key 'accountant' = 'pld': dp-accounting's PLD has no "
                        "fixed-size (without replacement) sampling; use accountant 'rdp' or "
                        "sampling 'poisson'")
    if cfg.noise_multiplier is None and cfg.target_epsilon is None:
      raise ConfigError("dp 'central' needs noise_multiplier or target_epsilon")
  if cfg.dp == "local" and cfg.noise_multiplier is None:
    raise ConfigError("dp 'local' needs noise_multiplier (target_epsilon, if given, caps each "
                      "client's own ledger)")
  if cfg.noise_schedule != "static" and cfg.dp == "none":
    raise ConfigError(f"config key 'noise_schedule' = {cfg.noise_schedule!r} with dp 'none': "
                      "adaptive noise needs dp 'local' or 'central'")
  if cfg.noise_schedule != "static" and cfg.adaptive_clipping:
    raise ConfigError(f"config key 'noise_schedule' = {cfg.noise_schedule!r} with "
                      "adaptive_clipping: use one or the other")
  if cfg.noise_schedule == "weighted" and cfg.clip_parts != "tiers":
    raise ConfigError("config key 'noise_schedule' = 'weighted': the sensitivity weights are per "
                      f"tier (needs clip_parts 'tiers'; clip_parts is {cfg.clip_parts!r})")
  if cfg.noise_multiplier is not None and 0 < cfg.noise_multiplier < MIN_NOISE_MULTIPLIER:
    raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g}: must be 0 (no "
                      f"noise) or >= {MIN_NOISE_MULTIPLIER:g} (below it the accountant's "
                      "arithmetic overflows; any such run has no meaningful epsilon)")
  if cfg.accountant == "pld" and cfg.noise_multiplier is not None and cfg.dp != "none":
    from fedjax_dp.privacy.planning import PLD_MIN_NOISE_MULTIPLIER
    z_pld = cfg.noise_multiplier / (2 if cfg.dp == "local" else 1)   # local: replace-one, z / 2
    if 0 < z_pld < PLD_MIN_NOISE_MULTIPLIER:
      raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g} with "
                        f"accountant 'pld': PLD needs a multiplier >= {PLD_MIN_NOISE_MULTIPLIER:g}"
                        f"{' (z / 2 under local DP)' if cfg.dp == 'local' else ''}; use "
                        "accountant 'rdp'")
  if cfg.noise_schedule != "static" and cfg.accountant == "pld":
    raise ConfigError(f"config key 'accountant' = 'pld' with noise_schedule "
                      f"{cfg.noise_schedule!r}: the noise changes each round; use 'rdp'")
  if cfg.client_budgets == "allocated" and (cfg.dp != "local" or cfg.target_epsilon is None):
    raise ConfigError("config key 'client_budgets' = 'allocated': per-client budgets need dp "
                      "'local' and target_epsilon (the mean budget)")
  if cfg.cluster_noise != "uniform" and (cfg.aggregator != "cluster" or cfg.dp != "local"):
    raise ConfigError(f"config key 'cluster_noise' = {cfg.cluster_noise!r}: per-cluster noise "
                      f"needs aggregator 'cluster' and dp 'local' (aggregator is "
                      f"{cfg.aggregator!r}, dp {cfg.dp!r})")
  if cfg.adaptive_clipping and cfg.dp != "central":
    raise ConfigError(f"config key 'adaptive_clipping' = true: needs dp 'central' (dp is "
                      f"{cfg.dp!r})")
  from fedjax_dp.objectives import parse_algorithm
  try:
    terms, _ = parse_algorithm(cfg.algorithm)
  except ValueError as e:
    raise ConfigError(f"config key 'algorithm' = {cfg.algorithm!r}: {str(e).split(': ', 1)[1]}")
  if "solo" in terms and cfg.dp != "none":
    raise ConfigError(f"config key 'algorithm' = 'solo' with dp {cfg.dp!r}: SOLO's clients "
                      "send nothing, and the per-client models it evaluates are never noised, "
                      "so no epsilon would describe the run; use dp 'none'")
  if "scaffold" in terms and cfg.dp != "none":
    raise ConfigError(f"config key 'algorithm' = {cfg.algorithm!r} with dp {cfg.dp!r}: SCAFFOLD's "
                      "control variates are not privatized, so no guarantee would hold")
  # kept_noise's guarantee covers the noised upload only; of the local terms, SCAFFOLD sends
  # more (objectives.finish's contribution) and SOLO's models are evaluated, never noised
  # (fedprox, contrastive, moon and fedadmm keep their extra state on the client)
  if cfg.kept_noise != "none" and "scaffold" in terms:
    raise ConfigError(f"config key 'kept_noise' = {cfg.kept_noise!r} with algorithm "
                      f"{cfg.algorithm!r}: SCAFFOLD's control-variate update c_i' - c_i is built "
                      "from the raw, unclipped update and reaches the server unnoised, so no "
                      "kept-noise guarantee would hold")
  if cfg.kept_noise != "none" and "solo" in terms:
    raise ConfigError(f"config key 'kept_noise' = {cfg.kept_noise!r} with algorithm 'solo': "
                      "SOLO's per-client models are evaluated and never noised, so no kept-noise "
                      "guarantee would describe the run")
  if cfg.kept_noise != "none":
    if cfg.s_local == 0:
      raise ConfigError(f"config key 'kept_noise' = {cfg.kept_noise!r}: noise on the kept "
                        "coordinates needs top-k (s_local > 0)")
    if cfg.coordinate_clip is None and cfg.update_clip_l2 is None and cfg.final_clip_l2 is None:
      raise ConfigError(f"config key 'kept_noise' = {cfg.kept_noise!r}: needs final_clip_l2, "
                        "coordinate_clip or update_clip_l2 (the noise is calibrated to the clip)")
    if cfg.kept_noise == "paper" and cfg.ldp_epsilon is None:
      raise ConfigError("config key 'kept_noise' = 'paper': needs ldp_epsilon (the per-round "
                        "client budget of the paper's calibration)")
  from fedjax_dp.robust import get_aggregator
  aggregator = get_aggregator(cfg.aggregator)
  if not aggregator.linear and cfg.dp == "central":
    raise ConfigError(f"config key 'aggregator' = {cfg.aggregator!r} with dp 'central': the "
                      "server noise is calibrated to a sum of clipped updates, which only "
                      "'mean' computes (robust rules are post-processing under dp 'local')")
  if (not aggregator.linear or cfg.byzantine_fraction > 0) and \
      cfg.kept_noise_draw == "aggregate":
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with aggregator "
                      f"{cfg.aggregator!r}, byzantine_fraction {cfg.byzantine_fraction:g}: only "
                      "honest uploads under the weighted mean have the aggregate's noise in "
                      "closed form (use 'client' or 'auto')")
  if not aggregator.linear and cfg.shuffle != "none":
    raise ConfigError(f"config key 'aggregator' = {cfg.aggregator!r} with shuffle "
                      f"{cfg.shuffle!r}: the robust rules are not defined on per-layer shuffled "
                      "tuples; use aggregator 'mean' with the shuffler")
  problem = aggregator.check(cfg)   # the rule's own keys (Krum's f and m)
  if problem:
    raise ConfigError(problem)
  if cfg.byzantine_fraction > 0 and int(cfg.byzantine_fraction * cfg.num_clients + 1e-9) == 0:
    raise ConfigError(f"config key 'byzantine_fraction' = {cfg.byzantine_fraction:g}: of "
                      f"{cfg.num_clients} clients that is no malicious client (floor of "
                      f"fraction x num_clients); at least {1 / cfg.num_clients:g}")
  if cfg.byzantine_scale > FLOAT32_MAX:
    raise ConfigError(f"config key 'byzantine_scale' = {cfg.byzantine_scale:g}: above float32's "
                      "largest value (3.4e38)")
  if cfg.kept_noise_draw == "aggregate" and cfg.dp != "none":
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with dp {cfg.dp!r}: the DP "
                      "clip comes after the pipeline, so the noise must be drawn per client "
                      "(use 'client' or 'auto')")
  if cfg.dp == "local" and cfg.s_local > 0 and cfg.index_selection == "topk":
    # the bytes are a sparse upload's, whose positions are the update's largest, unnoised;
    # the epsilon is a dense noised vector's
    raise ConfigError(f"config key 'index_selection' = 'topk' with dp 'local' and s_local "
                      f"{cfg.s_local:g}: the top-k positions come from the private update and "
                      "are sent unnoised, outside the local guarantee; use random_k or "
                      "public_topk")
  if cfg.final_clip_l2 is not None and cfg.s_local == 0:
    raise ConfigError("config key 'final_clip_l2' clips the sent top-k update: needs s_local > 0 "
                      "(without top-k use update_clip_l2)")
  if cfg.index_selection == "public_topk" and cfg.s_local == 0:
    raise ConfigError("config key 'index_selection' = 'public_topk': needs s_local > 0")
  from fedjax_dp.data import TABULAR
  if cfg.feature_scaling != "auto" and cfg.dataset == "custom":
    raise ConfigError(f"config key 'feature_scaling' = {cfg.feature_scaling!r} with dataset "
                      "'custom': your own data is used as given; scale it before "
                      "data.from_arrays (e.g. with data.scale_features) and leave it 'auto'")
  if cfg.feature_scaling != "auto" and cfg.dataset not in TABULAR:
    raise ConfigError(f"config key 'feature_scaling' = {cfg.feature_scaling!r} with dataset "
                      f"{cfg.dataset!r}: images are scaled to [0, 1] by a fixed rule; only "
                      f"{', '.join(TABULAR)} are standardised (leave it 'auto')")
  if cfg.dataset == "csv" and not cfg.csv_path:
    raise ConfigError("config key 'csv_path' is required when dataset = 'csv'")


def make_config(overrides: dict[str, Any] | None = None, base: Config | None = None) -> Config:
  """Returns a validated Config: `base` (or the defaults) with `overrides` applied.
  An algorithm's PRESETS fill the keys `overrides` leave out, on the defaults or
  when `overrides` names the algorithm; a `base` (a saved, resolved config) keeps
  its own values (a resumed topksdp run with s_global 0 stays at 0)."""
  values = (base or Config()).to_dict()
  raw = dict(overrides or {})
  algorithm = str(raw.get("algorithm", values["algorithm"]))
  for name, preset in PRESETS.items():
    if name in [a.strip() for a in algorithm.split("+")] and (base is None
                                                               or "algorithm" in raw):
      values.update({k: v for k, v in preset.items() if k not in raw})
  for key, value in raw.items():
    if key not in _FIELDS:
      raise ConfigError(
          f"unknown config key '{key}' (allowed: {', '.join(sorted(_FIELDS))})")
    values[key] = _coerce(key, value)
  values["hidden"] = tuple(values["hidden"])
  values["tier_noise_multipliers"] = tuple(values["tier_noise_multipliers"])
  cfg = Config(**values)
  _check(cfg, raw)
  return cfg


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


def load_config(path: str | None = None, sets: list[str] | None = None) -> Config:
  """Defaults, then the YAML file at `path`, then `key=value` overrides."""
  overrides: dict[str, Any] = {}
  if path:
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
    overrides.update(loaded)
  overrides.update(parse_set(sets or []))
  return make_config(overrides)
