"""krum and multi_krum (Blanchard et al. 2017), for at most f = `byzantine_f`
Byzantine clients: score_i = the sum of the squared distances from u_i to its
n - f - 2 nearest other participants; Krum returns the update of least score,
Multi-Krum the plain mean of the m = `multi_krum_m` (0: n - f) of least score.
flagged: the participants left out."""

import jax.numpy as jnp

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust.base import Aggregator, metrics, on_finite_uploads


def _krum(u, mask, weights, state, hp):
  n = jnp.sum(mask, dtype=jnp.int32)
  keep = jnp.int32(1)
  return ra.krum(u, mask, f=hp["f"], m_keep=keep), state, metrics(n - jnp.minimum(keep, n))


def _multi_krum(u, mask, weights, state, hp):
  n = jnp.sum(mask, dtype=jnp.int32)
  f, m = hp["f"], hp["m"]
  keep = jnp.where(m > 0, m, jnp.maximum(n - f, 1)).astype(jnp.int32)
  return ra.krum(u, mask, f=f, m_keep=keep), state, metrics(n - jnp.minimum(keep, n))


def _check_f(hp, clients_per_round):
  if 2 * hp["f"] + 2 >= clients_per_round:
    return (f"config key 'byzantine_f' = {hp['f']}: Krum needs "
            f"clients_per_round > 2 byzantine_f + 2 (Blanchard et al. 2017; "
            f"clients_per_round is {clients_per_round})")
  return None


def _check_multi(hp, clients_per_round):
  if _check_f(hp, clients_per_round):
    return _check_f(hp, clients_per_round)
  if hp["m"] > clients_per_round:
    return (f"config key 'multi_krum_m' = {hp['m']}: at most "
            f"clients_per_round ({clients_per_round}); 0 means n - byzantine_f")
  return None


_KRUM = on_finite_uploads(_krum)
_MULTI_KRUM = on_finite_uploads(_multi_krum)


def krum(f: int = 0) -> Aggregator:
  """Krum for at most `f` Byzantine clients."""
  return Aggregator(name="krum", aggregate=_KRUM, hparams={"f": f}, reports=("flagged",),
                    check=_check_f)


def multi_krum(f: int = 0, m: int = 0) -> Aggregator:
  """Multi-Krum: the mean of the `m` (0: n - f) uploads of least score."""
  return Aggregator(name="multi_krum", aggregate=_MULTI_KRUM, hparams={"f": f, "m": m},
                    reports=("flagged",), check=_check_multi)
