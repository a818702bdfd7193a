"""Who may take part in which round, as the sampler enforces it and the accountant
reads it.

  schema(sampling, num_clients, clients_per_round, rounds) -> Participation
      the participation pattern a sampler allows: the accountant of a mechanism
      without amplification (correlated noise, privacy/mechanisms/correlated.py)
      reads its min_sep and max_participations from here, the function the sampler
      itself is built from, never from a config key of its own
  cyclic_groups(num_clients, clients_per_round, seed) -> [groups, clients_per_round]
      sampling 'cyclic' (fixed epochs, Choquette-Choo et al. 2023's (k, b)
      participation): the clients split once into b = num_clients /
      clients_per_round groups by a public permutation of the data seed; round t
      trains group t mod b, so each client takes part every b rounds exactly,
      ceil(rounds / b) times at most
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CYCLIC_DRAW = 2**20 + 7   # folded into the data seed: the groups of sampling 'cyclic'


class Participation(NamedTuple):
  """A sampler's participation pattern, as the accountant reads it."""
  sampling: str               # 'fixed' | 'poisson' (random cohorts: amplification by
                              # sampling) | 'cyclic' (a fixed schedule)
  min_sep: int                # rounds between two participations of one client, at least
                              # (1: any round)
  max_participations: int     # a client's participations in the run, at most


def schema(sampling: str, num_clients: int, clients_per_round: int,
           rounds: int) -> Participation:
  """The participation pattern of `sampling` over `rounds` rounds: 'cyclic' every
  b = num_clients / clients_per_round rounds, ceil(rounds / b) times; a random
  cohort (fixed, poisson) any round, every round at worst."""
  if sampling == "cyclic":
    b = groups_of(num_clients, clients_per_round)
    return Participation(sampling, b, math.ceil(rounds / b))
  return Participation(sampling, 1, rounds)


def groups_of(num_clients: int, clients_per_round: int) -> int:
  """b, the groups of sampling 'cyclic'; ValueError where they would not be whole."""
  if num_clients % clients_per_round:
    raise ValueError(f"sampling 'cyclic' needs num_clients ({num_clients}) a multiple of "
                     f"clients_per_round ({clients_per_round}): every round trains one whole "
                     "group")
  return num_clients // clients_per_round


def cyclic_groups(num_clients: int, clients_per_round: int, seed: int) -> np.ndarray:
  """int32 [b, clients_per_round]: group g's clients, a seeded public permutation of
  all clients cut in b rows (each client in exactly one)."""
  b = groups_of(num_clients, clients_per_round)
  perm = np.random.default_rng([seed, CYCLIC_DRAW]).permutation(num_clients)
  return perm.reshape(b, clients_per_round).astype(np.int32)
