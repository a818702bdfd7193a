"""BandMF (Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization"):
DP-FTRL's matrix mechanism with a lower-triangular strategy of `mf_bands` bands,
column-normalised, optimised by jax-privacy for the run's rounds and the server
optimizer's workload (prefix sums, or momentum SGD's with server momentum).

With at most `bands` <= min_sep (the sampler's separation of one client's
participations), the columns a client touches do not overlap, so C's sensitivity
is sqrt(k) for k participations (jax-privacy's banded.minsep_sensitivity_squared):
the noise std is z sqrt(k) C and the run one Gaussian of multiplier z. With one
band it is independent Gaussian noise, accounted without amplification. Round t
charges its participation's share when one can start (a participation every
min_sep rounds: the (j+1)-th after round j min_sep). The noise keeps `bands`
model-sized buffers (privacy/mechanisms/correlated.py).

The optimised strategy is cached on disk by its parameters (strategy_cache.py).
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.mechanisms import correlated, strategy_cache


def bands_for(mf_bands: int | None, participation, rounds: int) -> int:
  """mf_bands, or (null) as many as the participation's separation allows (at most
  the rounds, and MAX_DEFAULT_BANDS)."""
  return int(mf_bands) if mf_bands else min(participation.min_sep, rounds, MAX_DEFAULT_BANDS)


MAX_DEFAULT_BANDS = 32    # optimisation time grows with them; papers use b <= min_sep


def strategy_for(settings: dict, participation, rounds: int) -> correlated.Strategy:
  """The run's BandMF strategy: optimised (or read from the cache), its sensitivity
  under the participation, and the per-round charges."""
  from jax_privacy.matrix_factorization import banded
  # bands above min_sep: the config's checks refuse them, jax-privacy's sensitivity too
  bands = bands_for(settings.get("mf_bands"), participation, rounds)
  momentum = float(settings.get("server_momentum") or 0.0)
  decay = settings.get("server_lr_decay")   # cosine to this fraction of server_lr, or None
  params = strategy_cache.bandmf_params(rounds, bands, momentum, lr_decay=decay,
                                        rates=settings.get("server_lr_rates"))
  strategy = banded.ColumnNormalizedBanded(params=params)
  k, b = participation.max_participations, participation.min_sep
  sampled = correlated.amplified(participation)
  if sampled is not None:
    # amplified: each participation is one column (norm 1), charged as its cycle starts
    points = [min(rounds, (j + 1) * b) for j in range(k)]
    sens2 = [float(banded.minsep_sensitivity_squared(strategy, b, 1, n=rounds))] * k
    charges = correlated.charges_from_prefixes(rounds, points, np.arange(1.0, k + 1))
  else:
    # the (j+1)-th participation can start after round j min_sep: the first j min_sep + 1
    # rounds hold at most j + 1 (jax-privacy counts them)
    points = sorted({min(rounds, j * b + 1) for j in range(k)} | {rounds})
    sens2 = [float(banded.minsep_sensitivity_squared(strategy, b, None, n=p)) for p in points]
    charges = correlated.charges_from_prefixes(rounds, points, sens2)
  inverse = _inverse(params)
  return correlated.Strategy(
      "bandmf", inverse, sens2[-1], charges,
      f"BandMF, {bands} band{'s' * (bands > 1)} optimised for {rounds} rounds"
      f"{f' and server momentum {momentum:g}' if momentum else ''}"
      + (f" and a cosine server learning rate to {decay:g} of server_lr" if decay is not None
         else "")
      + f" (mean error of the {_workload(momentum, decay)} workload)"
      + (f", amplified by cyclic Poisson sampling (q = {sampled[0]:.6g} in a client's "
         f"group's rounds, {k} cycles)" if sampled else ""),
      *correlated.error_factors(inverse, rounds), sampled=sampled and sampled[0])


def _workload(momentum: float, decay: float | None) -> str:
  """The name of the workload the strategy is optimised for (the server optimizer's
  linear part: Adam's is not linear, so under it this is SGD's)."""
  if momentum:
    return "momentum SGD"
  return "prefix-sum" if decay is None else "decaying-rate SGD"


def _inverse(params: np.ndarray):
  """C^{-1} streamed (jax-privacy's Algorithm 9), float32 buffers in the round."""
  import jax.numpy as jnp
  from jax_privacy.matrix_factorization import banded
  return banded.ColumnNormalizedBanded(
      params=jnp.asarray(params, jnp.float32)).inverse_as_streaming_matrix()


def bandmf():
  return correlated.mechanism(
      "bandmf", strategy_for,
      "BandMF (DP-FTRL with a banded matrix factorization; user level): each client's update "
      "clipped to L2 norm clip_norm by the server, the sum noised with the strategy's "
      "correlated noise z sens clip_norm (C^-1 xi)_t, divided by clients_per_round",
      reads=("mf_bands",), amplifies=True)
