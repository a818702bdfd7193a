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


def make_server_optimizer(cfg: Config, lr=None, momentum=None) -> optax.GradientTransformation:
  """The optimizer; `lr` and `momentum` (default: the config's) may be traced
  arrays (hyperparameters as data: hparams.py). Adam's betas and eps stay
  constants: optax computes 1 - beta from them, which rounds differently from
  a float32 array's."""
  name = server_optimizer_name(cfg)
  lr = cfg.server_lr if lr is None else lr
  if name == "sgd":
    return optax.sgd(lr)
  if name == "momentum":
    return optax.sgd(lr, momentum=cfg.server_momentum if momentum is None else momentum)
  if name == "adam":
    return optax.adam(lr, b1=cfg.server_beta1, b2=cfg.server_beta2, eps=cfg.server_eps)
  raise ValueError(f"unknown server optimizer {name!r} (allowed: sgd, momentum, adam)")
