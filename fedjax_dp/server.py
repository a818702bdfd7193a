"""Server optimizers over the pseudo-gradient g = -mean_i(delta_i) (Reddi et al. 2021).

  sgd:      w <- w - server_lr * g                      (server_lr = 1 is plain FedAvg)
  momentum: v <- server_momentum * v + g;  w <- w - server_lr * v   (FedAvgM)
  adam:     Adam(server_lr, beta1, beta2, eps) on g                 (FedAdam)
"""

import optax

from fedjax_dp.config import Config


def server_optimizer_name(cfg: Config) -> str:
  """`server_optimizer`, or with 'auto' the one the algorithm implies
  (fedavgm: momentum, fedadam: adam, otherwise sgd)."""
  if cfg.server_optimizer != "auto":
    return cfg.server_optimizer
  from fedjax_dp.objectives import parse_algorithm
  return parse_algorithm(cfg.algorithm)[1]


def make_server_optimizer(cfg: Config) -> optax.GradientTransformation:
  name = server_optimizer_name(cfg)
  if name == "sgd":
    return optax.sgd(cfg.server_lr)
  if name == "momentum":
    return optax.sgd(cfg.server_lr, momentum=cfg.server_momentum)
  if name == "adam":
    return optax.adam(cfg.server_lr, b1=cfg.server_beta1, b2=cfg.server_beta2, eps=cfg.server_eps)
  raise ValueError(f"unknown server optimizer {name!r} (allowed: sgd, momentum, adam)")
