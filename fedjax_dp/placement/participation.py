"""Who may take part in which round, as the sampler enforces it and the accountant
reads it.

  schema(sampling, num_clients, clients_per_round, rounds, min_separation)
      -> Participation: the pattern a sampler allows, and what it is built from
      (placement/cohort.make_sampler takes it): the accountant of correlated noise
      (privacy/mechanisms/correlated.py) reads min_sep, max_participations and,
      for amplification, sampling_prob from here, never from a config key of its own
  cyclic_groups(num_clients, groups, seed) -> [groups, num_clients / groups]
      the clients split once into b groups by a public permutation of the data
      seed (jax-privacy's equal split): sampling 'cyclic' trains group t mod b
      whole; 'cyclic_poisson' draws each of its clients with probability q

The samplings (b: the separation; k = ceil(rounds / b) participations at most):
  fixed, poisson   a random cohort, any round (b = 1, k = rounds)
  cyclic           fixed epochs (Choquette-Choo et al. 2023's (k, b) participation),
                   b = num_clients / clients_per_round groups trained in turn
  cyclic_poisson   b = min_separation groups; round t draws each client of group
                   t mod b with q = clients_per_round b / num_clients (Poisson
                   inside the group: what amplified BandMF is accounted for)
  balls_in_bins    each client in a random bin of b = num_clients /
                   clients_per_round (drawn once from the run key, secret), round
                   t trains bin t mod b (Chua et al. 2024)
  min_sep          b-min-separation with random availability (Gboard's rule): each
                   round each client who has not taken part in the last b - 1 rounds
                   is available and drawn with probability p, set so the steady
                   cohort is clients_per_round: 1 / p = num_clients / clients_per_round
                   - b + 1 (jax-privacy's BMinSepSampling, warm started)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CYCLIC_DRAW = 2**20 + 7   # folded into the data seed: the groups of sampling 'cyclic'
SAMPLINGS = ("fixed", "poisson", "cyclic", "cyclic_poisson", "balls_in_bins", "min_sep")
SEPARATED = ("cyclic", "cyclic_poisson", "balls_in_bins", "min_sep")   # b > 1 enforced
RANDOM_COHORTS = ("poisson", "cyclic_poisson", "balls_in_bins", "min_sep")   # sized at random
TAKES_SEPARATION = ("cyclic_poisson", "min_sep")   # the config's min_separation
SECRET_DRAWS = ("poisson", "cyclic_poisson")   # amplification takes who was drawn as secret:
                                               # the realised cohort sizes are not published


class Participation(NamedTuple):
  """A sampler's participation pattern, as the accountant reads it and the cohort
  sampler is built from it."""
  sampling: str               # one of SAMPLINGS
  min_sep: int                # rounds between two participations of one client, at least
                              # (1: any round)
  max_participations: int     # a client's participations in the run, at most
  num_clients: int = 0
  clients_per_round: int = 0  # the cohort (its expectation where drawn at random)
  sampling_prob: float | None = None  # cyclic_poisson: q in its group's rounds; min_sep: p
                                      # among the eligible; None otherwise


def schema(sampling: str, num_clients: int, clients_per_round: int, rounds: int,
           min_separation: int | None = None) -> Participation:
  """The participation pattern of `sampling` over `rounds` rounds (module
  docstring); ValueError where the numbers do not make one."""
  n, m = num_clients, clients_per_round
  if sampling in ("fixed", "poisson"):
    return Participation(sampling, 1, rounds, n, m)
  if sampling in ("cyclic", "balls_in_bins"):
    b = groups_of(n, m, sampling)
    return Participation(sampling, b, math.ceil(rounds / b), n, m)
  b = _separation(sampling, min_separation, n, m)
  if sampling == "cyclic_poisson":
    return Participation(sampling, b, math.ceil(rounds / b), n, m, m * b / n)
  if sampling == "min_sep":
    return Participation(sampling, b, math.ceil(rounds / b), n, m, 1.0 / (n / m - b + 1))
  raise ValueError(f"unknown sampling {sampling!r} (allowed: {', '.join(SAMPLINGS)})")


def groups_of(num_clients: int, clients_per_round: int, sampling: str = "cyclic") -> int:
  """b, the groups (bins) of sampling 'cyclic' or 'balls_in_bins'; ValueError where
  they would not be whole."""
  if num_clients % clients_per_round:
    raise ValueError(f"sampling {sampling!r} needs num_clients ({num_clients}) a multiple of "
                     f"clients_per_round ({clients_per_round}): a round trains one group of "
                     "num_clients / clients_per_round")
  return num_clients // clients_per_round


def _separation(sampling: str, b: int | None, n: int, m: int) -> int:
  """min_separation checked against the population: at most n / m (a larger b could
  not give a cohort of m); cyclic_poisson's groups whole."""
  if b is None:
    raise ValueError(f"sampling {sampling!r} needs min_separation (the rounds between two "
                     "participations of a client, at least 1)")
  if b < 1 or b * m > n:
    raise ValueError(f"min_separation {b} with sampling {sampling!r}: must be 1 to "
                     f"num_clients / clients_per_round = {n / m:g} (a larger separation "
                     f"cannot fill cohorts of {m})")
  if sampling == "cyclic_poisson" and n % b:
    raise ValueError(f"min_separation {b} with sampling 'cyclic_poisson': num_clients ({n}) "
                     "must be a multiple of it (the clients split into min_separation equal "
                     "groups)")
  return b


def cyclic_groups(num_clients: int, groups: int, seed: int) -> np.ndarray:
  """int32 [groups, num_clients / groups]: group g's clients, a seeded public
  permutation of all clients cut in rows (each client in exactly one)."""
  perm = np.random.default_rng([seed, CYCLIC_DRAW]).permutation(num_clients)
  return perm.reshape(groups, num_clients // groups).astype(np.int32)
