"""Server optimizers over the pseudo-gradient g = -mean_i(delta_i) (Reddi et al. 2021).

  fedavg:  w <- w - server_lr * g                      (server_lr = 1 is plain FedAvg)
  fedavgm: v <- server_momentum * v + g;  w <- w - server_lr * v
  fedadam: Adam(server_lr, beta1, beta2, eps) on g
"""

import optax

from fedjax_dp.config import Config


def make_server_optimizer(cfg: Config) -> optax.GradientTransformation:
  if cfg.algorithm == "fedavg":
    return optax.sgd(cfg.server_lr)
  if cfg.algorithm == "fedavgm":
    return optax.sgd(cfg.server_lr, momentum=cfg.server_momentum)
  if cfg.algorithm == "fedadam":
    return optax.adam(cfg.server_lr, b1=cfg.server_beta1, b2=cfg.server_beta2, eps=cfg.server_eps)
  raise ValueError(f"unknown algorithm {cfg.algorithm!r} (allowed: fedavg, fedavgm, fedadam)")
