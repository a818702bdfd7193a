"""FedProx (Li et al. 2020): the client adds mu/2 ||w - w^t||^2. No state."""

from fedjax_dp.algorithms.base import LocalTerm, sq_dist


def _loss(inputs, hp):
  return 0.5 * hp["mu"] * sq_dist(inputs.params, inputs.global_params)


TERM = LocalTerm(name="fedprox", hparams=lambda cfg: {"mu": cfg.prox_mu}, loss=_loss,
                 keys=("prox_mu",))
