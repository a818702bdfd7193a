"""What a run configuration is: the Config dataclass with its keys and defaults,
each key's allowed values (CHOICES) and range (RANGES), the optional keys, and the
defaults an algorithm brings (PRESETS). No checking here (config/checks.py) and
no parsing (config/loading.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fedjax_dp.errors import ConfigError  # noqa: F401  (its old home; callers import it from here)


MIN_NOISE_MULTIPLIER = 1e-6   # 1e-300 overflowed the RDP arithmetic
FLOAT32_MAX = 3.4028234663852886e38


def data_seed(cfg: "Config") -> int:
  """The seed of the data: its split or generation, the partition over clients, which
  clients are Byzantine and the analyzer's networks (data_seed; null: seed). The model's
  initialisation is always seed's; the run key (cohorts, local training, noise) is
  seed's with the release's settings and inputs folded in (privacy/release_identity.py)."""
  return cfg.seed if cfg.data_seed is None else cfg.data_seed


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
  healthcare_generator: str = "logits"
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
  # local training (the defaults train the default data, digits, to ~95 % in 50 rounds)
  local_epochs: int = 2
  batch_size: int = 16
  lr: float = 0.05
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
  admm_upload: str = "augmented"
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
  filter_cosine: float = 0.0
  cluster_threshold: float = 0.5
  cluster_noise: str = "uniform"
  geomed_iters: int = 4
  geomed_eps: float = 1e-6
  cclip_tau: float = 1.0
  cclip_iters: int = 1
  byzantine_fraction: float = 0.0
  byzantine_attack: str = "sign_flip"
  byzantine_scale: float = 10.0
  byzantine_draw: str = "fixed"
  # privacy audit (privacy/audit.py): clients whose upload is a fixed random direction
  audit_canaries: int = 0
  # their uploads are this times clip_norm times the direction (0: they take no
  # part, the multi-run audit's runs without the canary)
  audit_canary_scale: float = 1.0
  # the server clips every upload it receives to this L2 norm (norm bounding); None: off
  server_clip_l2: float | None = None
  # data poisoning (robust/poisoning.py)
  attack_source_class: int = 1
  attack_target_class: int = 0
  backdoor_fraction: float = 0.5
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
  analyzer_rule: str = "semantic"
  analyzer_steps: int = 1500
  adaptive_clipping: bool = False
  target_quantile: float = 0.5
  clip_lr: float = 0.2
  clip_count_stddev: float | None = None
  # run
  rounds: int = 50
  eval_every: int = 5
  seed: int = 0
  data_seed: int | None = None
  noise_seed: str = "config"
  checkpoint_every: int = 0
  keep_checkpoints: int = 3
  devices: int = 0
  client_parallelism: str = "auto"
  client_batch: int = 0
  # per-client state off the device (placement/paged_state.py)
  client_state_store: str = "device"
  client_state_dtype: str = "float32"
  client_state_dir: str | None = None
  # float32: every matrix product in fp32; tensorfloat32 lets a GPU's tensor cores
  # round the inputs to 10 mantissa bits (JAX's own GPU default, faster, ~1e-3 error)
  matmul_precision: str = "float32"
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
    "admm_upload": ("augmented", "change"),
    "index_selection": ("topk", "random_k", "public_topk"),
    "topk_kernel": ("exact", "approx", "threshold", "bisect"),
    "noise_seed": ("config", "secret"),
    "kept_noise_draw": ("auto", "client", "aggregate"),
    "aggregator": (),   # the registered rules (fedjax_dp.robust.AGGREGATORS), read in _check
    "byzantine_attack": ("sign_flip", "scaled", "gaussian", "alie", "ipm", "label_flip",
                         "targeted", "backdoor"),
    "byzantine_draw": ("fixed", "round"),
    "kept_noise": ("none", "paper", "multiplier"),
    "shuffle": ("none", "layerwise"),
    "client_parallelism": ("auto", "map", "vmap", "one_step"),
    "client_state_store": ("device", "host", "disk"),
    "client_state_dtype": ("float32", "bfloat16"),
    "matmul_precision": ("float32", "tensorfloat32"),
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
    "healthcare_generator": ("logits", "severity"),
}

# key -> (low, high, low_inclusive, high_inclusive); None = unbounded
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "synthetic_examples": (10, None, True, True),
    "healthcare_examples": (10, None, True, True),
    "trim_fraction": (0, 0.5, True, False),
    "byzantine_f": (0, None, True, True),
    "multi_krum_m": (0, None, True, True),
    "outlier_z": (0, None, False, True),
    "filter_cosine": (-1, 1, True, True),
    "cluster_threshold": (-1, 1, True, False),
    "geomed_iters": (0, None, True, True),
    "geomed_eps": (0, None, False, True),
    "cclip_tau": (0, None, False, True),
    "cclip_iters": (1, None, True, True),
    "byzantine_fraction": (0, 1, True, False),
    "byzantine_scale": (0, None, True, True),
    "attack_source_class": (0, None, True, True),
    "attack_target_class": (0, None, True, True),
    "backdoor_fraction": (0, 1, False, True),
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
    "server_clip_l2": (0, None, False, True),
    "audit_canaries": (0, None, True, True),
    "audit_canary_scale": (-1, 1, True, True),
    "final_clip_l2": (0, None, False, True),
    "kept_noise_multiplier": (0, None, True, True),
    "ldp_epsilon": (0, None, False, True),
    "ldp_delta": (0, 1, False, False),
    "clip_lr": (0, None, False, True),
    "clip_count_stddev": (0, None, False, True),
    # round r's key is fold_in(run_key, r) and the model's initialisation key is
    # fold_in(run_key, 2^20) (core/state.MODEL_INIT): round 2^20 would reuse it
    "rounds": (1, 2**20, True, False),
    "analyzer_steps": (10, None, True, True),
    "convergence_lambda": (0, None, True, True),
    "convergence_window": (1, None, True, True),
    "convergence_beta": (0, 1, True, False),
    "noise_ema": (0, 1, True, False),
    "eval_every": (1, None, True, True),
    "seed": (0, 2**31 - 1, True, True),
    "data_seed": (0, 2**31 - 1, True, True),
    "checkpoint_every": (0, None, True, True),
    "keep_checkpoints": (1, None, True, True),
    "devices": (0, None, True, True),
    "client_batch": (0, None, True, True),
    "eval_batch_size": (1, None, True, True),
}

# the keys make_config accepts, and those that may be null (with their type when set)
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_OPTIONAL = {"data_seed": int, "data_dir": str, "client_state_dir": str, "csv_path": str, "tier_map_path": str, "max_cohort": int, "noise_multiplier": float,
             "target_epsilon": float, "clip_count_stddev": float, "coordinate_clip": float,
             "update_clip_l2": float, "final_clip_l2": float, "ldp_epsilon": float,
             "server_clip_l2": float}

# algorithm presets: defaults a named algorithm brings, unless the user sets the key
PRESETS = {"topksdp": {"s_local": 0.9, "s_global": 0.9, "shuffle": "layerwise"}}
