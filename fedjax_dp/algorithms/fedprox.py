"""FedProx (Li et al. 2020): the client adds mu/2 ||w - w^t||^2. No state."""

from fedjax_dp.algorithms.base import LocalTerm, sq_dist


def _loss(inputs, hp):
  return 0.5 * hp["mu"] * sq_dist(inputs.params, inputs.global_params)


def fedprox(mu: float = 0.001) -> LocalTerm:
  """The FedProx term with proximal weight `mu`."""
  return LocalTerm(name="fedprox", hparams={"mu": mu}, loss=_loss)
