"""Stage choices, the building blocks `compose` assembles into a recipe.

Each function returns (slot, Choice) pairs, as optax's transforms are the
pieces an alias chains: `recipes.fedprox(mu)` is compose('fedprox',
term('fedprox', prox_mu=mu), sgd(1.0)). Keyword names are the config keys the
stage stands for (README, Config keys), with the Config's defaults; each stage
is built by its own module (through flat.py, the path from_config takes), so a
stage built here and the same stage read from a config are the same object.
"""

from __future__ import annotations

from typing import Any

from fedjax_dp.privacy import budgets, dp_round, mechanisms, noise_control

from fedjax_dp.compression import pipeline

from fedjax_dp.training import server_stages
from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.config.schema import config_of
from fedjax_dp.recipes import flat
from fedjax_dp.recipes.base import Choice

Slot = tuple[str, Choice]


def _cfg(**keys) -> Config:
  """A Config used as a plain namespace of keys (not validated: validate does that)."""
  return config_of(keys)


def term(name: str, **keys) -> Slot:
  """The local term `name` (algorithms.TERMS) with its config keys, e.g.
  term('fedprox', prox_mu=0.1), term('contrastive', contrastive_form='moon_params')."""
  (choice,) = flat.term_choices(_cfg(algorithm=name, **keys))
  return "terms", choice


def _server(kind: str, **keys) -> Slot:
  cfg = _cfg(server_optimizer=kind, **keys)
  return "server_optimizer", Choice(kind, flat._take(cfg, flat.SERVER_OPTIMIZER_KEYS))


def sgd(lr: float = 1.0) -> Slot:
  """w <- w - lr g on the pseudo-gradient g = -mean_i delta_i (lr 1: FedAvg's step)."""
  return _server("sgd", server_lr=lr)


def momentum(lr: float = 1.0, beta: float = 0.9) -> Slot:
  """v <- beta v + g; w <- w - lr v (FedAvgM, Hsu et al. 2019)."""
  return _server("momentum", server_lr=lr, server_momentum=beta)


def adam(lr: float = 1.0, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> Slot:
  """optax.adam on the pseudo-gradient (FedAdam, Reddi et al. 2021; with bias correction)."""
  return _server("adam", server_lr=lr, server_beta1=b1, server_beta2=b2, server_eps=eps)


def aggregator(name: str = "mean", **keys) -> Slot:
  """The aggregation rule `name` (robust.AGGREGATORS) with its config keys, e.g.
  aggregator('trimmed_mean', trim_fraction=0.2)."""
  return "aggregator", flat.aggregator_choice(_cfg(aggregator=name, **keys))


def upload(**keys) -> list[Slot]:
  """The client upload stages the pipeline keys name (coordinate_clip,
  update_clip_l2, s_local, index_selection, error_feedback, topk_kernel,
  final_clip_l2, kept_noise, kept_noise_multiplier, kept_noise_draw, ldp_epsilon,
  ldp_delta), in the paper's order. kept_noise_draw 'auto' is resolved by
  `compose` against the recipe's mechanism and rule (on the aggregate only under
  the plain weighted mean without DP; a run's Byzantine clients, a set-up key,
  make its config resolve it per client)."""
  choices = flat.upload_choices(_cfg(**keys))
  taken = {k for c in choices for k in c.config}
  for key, value in keys.items():   # a number no stage took would be dropped silently
    if key not in taken and value != getattr(Config(), key, value):
      from fedjax_dp.recipes.config_checks import read_condition
      raise ConfigError(f"recipes upload: config key {key!r} = {value!r} is read by no upload "
                        f"stage these keys build; it is read with "
                        f"{read_condition(key) or 'another stage'}")
  return [("upload", c) for c in choices]


def shuffle(name: str = "layerwise") -> Slot:
  """A permutation of the cohort's uploads per layer before aggregation (pipeline.SHUFFLERS)."""
  return "shuffle", Choice(pipeline.SHUFFLERS[name], {"shuffle": name})


def downlink_topk(sparsity: float, kernel: str = "exact") -> Slot:
  """The server broadcasts the top (1 - sparsity) coordinates of its update, keeping
  the rest for the next round (error feedback)."""
  return "server", Choice(server_stages.downlink_topk_spec(sparsity, kernel),
                          {"s_global": sparsity, "topk_kernel": kernel})


def public_update() -> Slot:
  """Records the released update: public_topk's index selection reads it next round."""
  return "server", Choice(server_stages.public_update_spec(), {"index_selection": "public_topk"})


def cluster_noise(threshold: float = 0.5) -> Slot:
  """The cluster rule that sets each client's next local noise by the size of the
  cluster it fell in (per-cluster noise): aggregator('cluster', cluster_noise=...)."""
  return aggregator("cluster", cluster_threshold=threshold, cluster_noise="equalize")


def _mechanism(dp: str, keys: dict[str, Any]) -> Slot:
  cfg = _cfg(dp=dp, **keys)
  return "privacy", Choice(mechanisms.get_mechanism(dp), flat._take(cfg, flat.MECHANISM_KEYS))


def central_dp(**keys) -> Slot:
  """Central DP: each upload clipped to clip_norm, N(0, (z C)^2) on the sum by the
  server, accounted per round (keys: noise_multiplier or target_epsilon, clip_norm,
  delta, accountant, clip_parts, rest_tier, tier_noise_multipliers, tier_source,
  analyzer_rule, analyzer_steps)."""
  return _mechanism("central", keys)


def local_dp(**keys) -> Slot:
  """Local DP: each client clips and noises its own upload, N(0, (z C)^2), and keeps
  its own ledger (keys as central_dp; target_epsilon caps each client's ledger)."""
  return _mechanism("local", keys)


def correlated_dp(strategy: str = "bandmf", **keys) -> Slot:
  """DP-FTRL: each upload clipped to clip_norm by the server, the sum noised with
  noise correlated across rounds by `strategy` ('tree', 'bandmf', 'blt';
  privacy/mechanisms/correlated.py), the run one Gaussian (keys: noise_multiplier or
  target_epsilon, clip_norm, delta, clip_parts, mf_bands). The participation is the
  set-up's sampling ('cyclic' for a schedule)."""
  return _mechanism(strategy, keys)


def noise_schedule(kind: str = "convergence", **keys) -> Slot:
  """The noise planner (noise_control.PLANNERS): 'convergence' lowers the noise as
  the released updates settle, 'weighted' per sensitivity tier (keys:
  convergence_measure, convergence_lambda, convergence_window, convergence_beta,
  noise_ema)."""
  cfg = _cfg(noise_schedule=kind, **keys)
  return "planner", Choice(noise_control.PLANNERS[kind], flat._take(cfg, flat.PLANNER_KEYS))


def adaptive_clipping(**keys) -> Slot:
  """The clip norm follows a noised quantile of the update norms (Andrew et al. 2021;
  keys: target_quantile, clip_lr, clip_count_stddev)."""
  cfg = _cfg(adaptive_clipping=True, **keys)
  return "adaptive_clip", Choice(dp_round.ADAPTIVE_CLIPPING,
                                 flat._take(cfg, flat.ADAPTIVE_KEYS))


def allocated_budgets() -> Slot:
  """Per-client target epsilons shared out of target_epsilon (the dynamic-DP paper)."""
  return "budgets", Choice(budgets.ALLOCATED, {"client_budgets": "allocated"})
