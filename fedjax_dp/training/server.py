"""Server optimizers over the pseudo-gradient g = -mean_i(delta_i) (Reddi et al. 2021).

  sgd:      w <- w - server_lr * g                      (server_lr = 1 is plain FedAvg)
  momentum: v <- server_momentum * v + g;  w <- w - server_lr * v   (FedAvgM)
  adam:     Adam(server_lr, beta1, beta2, eps) on g                 (FedAdam)

server_lr_schedule 'cosine' multiplies server_lr in round t by cosine_factor(t):
from 1 down to alpha = server_lr_min / server_lr over `rounds` (never 0 before the
end); the round computes it in jax, a correlated-noise strategy's workload in numpy.
"""

import numpy as np
import optax


def cosine_factor(t, rounds: int, alpha, xp=np):
  """The server learning rate of round t (0-based) over server_lr: alpha + (1 -
  alpha) (1 + cos(pi t / rounds)) / 2; `xp` numpy or jax.numpy."""
  count = xp.minimum(t, rounds).astype(xp.float32 if xp is not np else np.float64)
  return alpha + (1.0 - alpha) * 0.5 * (1.0 + xp.cos(xp.pi * count / rounds))


def make_optimizer(name: str, lr, momentum=0.9, b1: float = 0.9, b2: float = 0.99,
                   eps: float = 1e-3) -> optax.GradientTransformation:
  """sgd, momentum (FedAvgM) or adam (FedAdam) at server learning rate `lr`. `lr` and
  `momentum` may be traced arrays (hyperparameters as data: recipes/hparams.py); Adam's
  betas and eps stay constants: optax computes 1 - beta from them, which rounds
  differently from a float32 array's."""
  if name == "sgd":
    return optax.sgd(lr)
  if name == "momentum":
    return optax.sgd(lr, momentum=momentum)
  if name == "adam":
    return optax.adam(lr, b1=b1, b2=b2, eps=eps)
  raise ValueError(f"unknown server optimizer {name!r} (allowed: sgd, momentum, adam)")
