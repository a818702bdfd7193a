"""BLT-DP-FTRL (Dvijotham et al. 2024; McMahan, Xu, Zhang 2024): the matrix
mechanism with a Buffered Linear Toeplitz strategy, C's Toeplitz coefficients a
sum of a few decaying geometric sequences, optimised by jax-privacy for the run's
rounds and participation (min_sep, max_participations) and streamed with as many
model-sized buffers (privacy/mechanisms/correlated.py).

Unlike a banded strategy, every column of C reaches every later round, so the
sensitivity of the rounds released grows each round: jax-privacy's Toeplitz
min-sep sensitivity (McMahan et al. 2024, Theorem 2) of the first n rounds is
evaluated on a doubling grid of n, and each stretch of the grid is charged when it
opens (so the ledger is never below what was released; exact at the last round).
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.mechanisms import correlated, strategy_cache


def prefix_points(rounds: int) -> list[int]:
  """1, 2, 4, ... below rounds, then rounds: where the sensitivity is evaluated."""
  return sorted({2 ** i for i in range(max(1, rounds.bit_length())) if 2 ** i < rounds}
                | {rounds})


def strategy_for(settings: dict, participation, rounds: int) -> correlated.Strategy:
  """The run's BLT: optimised (or read from the cache), its Toeplitz sensitivity on
  the doubling grid of prefixes, and the per-round charges."""
  import jax
  from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz
  decay, scale = strategy_cache.blt_params(rounds, participation.min_sep,
                                           participation.max_participations)
  with jax.enable_x64():
    blt = buffered_toeplitz.BufferedToeplitz.build(buf_decay=decay, output_scale=scale)
    coefs = blt.toeplitz_coefs(rounds)
    points = prefix_points(rounds)
    sens2 = [float(toeplitz.minsep_sensitivity_squared(
        coefs, min_sep=participation.min_sep,
        max_participations=participation.max_participations, n=p)) for p in points]
  inverse = buffered_toeplitz.StreamingMatrixBuilder(
      buf_decay=np.asarray(decay, np.float32),
      output_scale=np.asarray(scale, np.float32)).build_inverse()
  return correlated.Strategy(
      "blt", inverse, sens2[-1], correlated.charges_from_prefixes(rounds, points, sens2),
      f"BLT with {len(decay)} buffer{'s' * (len(decay) > 1)} optimised for {rounds} rounds "
      f"(min_sep {participation.min_sep}, at most {participation.max_participations} "
      "participations; mean error of the prefix sums)", *correlated.error_factors(inverse, rounds))


def blt():
  return correlated.mechanism(
      "blt", strategy_for,
      "BLT-DP-FTRL (a buffered linear Toeplitz matrix factorization; user level): each "
      "client's update clipped to L2 norm clip_norm by the server, the sum noised with the "
      "strategy's correlated noise z sens clip_norm (C^-1 xi)_t, divided by clients_per_round")
