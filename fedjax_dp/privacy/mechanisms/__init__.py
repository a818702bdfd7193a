"""Privacy mechanisms, one module each, registered by the config's `dp` name.

  no_privacy        'none'     the uploads as they are, FedAvg's weighted mean
  central_gaussian  'central'  the trusted server clips and noises the sum (DP-FedAvg)
  local_gaussian    'local'    each client clips and noises its own report
  tree              'tree'     DP-FTRL: the server's noise correlated across rounds by
  bandmf            'bandmf'   a tree, a banded or a buffered Toeplitz factorization
  blt               'blt'      (correlated.py holds their shared round half)

and TopkSDP-FL's noise on the kept coordinates, by the config's `kept_noise` name
(kept_noise.py: 'paper', 'multiplier'), which sits on the client beside any of them.

A mechanism is a `Mechanism` bundle (base.py): the round's functions (plan,
admit, client half, release) and the static properties the round and the
recipes' checks read. `register_mechanism(m)` adds one from the user's code
(`register_kept_noise(k)` a calibration of the kept noise).
"""

from __future__ import annotations

from fedjax_dp.privacy.mechanisms.base import (DIVIDES_BY, Admission, CohortSampling, Mechanism,
                                               Plan, RoundSetup)
from fedjax_dp.privacy.mechanisms import (bandmf, blt, central_gaussian, kept_noise,
                                          local_gaussian, no_privacy, tree)
from fedjax_dp.privacy.mechanisms.kept_noise import KeptNoise

__all__ = ["DIVIDES_BY", "KEPT_NOISE", "MECHANISMS", "Admission", "CohortSampling", "KeptNoise",
           "Mechanism", "Plan", "RoundSetup", "get_mechanism", "register_kept_noise",
           "register_mechanism"]

MECHANISMS: dict[str, Mechanism] = {
    "none": no_privacy.no_privacy(),
    "central": central_gaussian.central_gaussian(),
    "local": local_gaussian.local_gaussian(),
    "tree": tree.tree(),
    "bandmf": bandmf.bandmf(),
    "blt": blt.blt(),
}

# the config's kept_noise names ('none': no kept noise, no bundle)
KEPT_NOISE: dict[str, KeptNoise] = {
    "paper": kept_noise.paper(),
    "multiplier": kept_noise.multiplier(),
}


def get_mechanism(name: str) -> Mechanism:
  """The registered mechanism `name`; ValueError naming the allowed ones."""
  if name not in MECHANISMS:
    raise ValueError(f"dp {name!r}: allowed values are {', '.join(MECHANISMS)}")
  return MECHANISMS[name]


def register_mechanism(mechanism: Mechanism) -> None:
  """Adds `mechanism` under its name (a new name, or the same bundle again)."""
  if not isinstance(mechanism, Mechanism):
    raise TypeError(f"register_mechanism: {mechanism!r} is not a Mechanism")
  old = MECHANISMS.get(mechanism.name)
  if old is not None and old != mechanism:
    raise ValueError(f"register_mechanism: {mechanism.name!r} is already registered")
  if mechanism.divides_by not in DIVIDES_BY:
    raise ValueError(f"register_mechanism: divides_by {mechanism.divides_by!r}: allowed "
                     f"values are {', '.join(DIVIDES_BY)}")
  if mechanism.boundary not in ("server", "client") and mechanism.private:
    raise ValueError(f"register_mechanism: boundary {mechanism.boundary!r}: allowed values "
                     "are server, client")
  MECHANISMS[mechanism.name] = mechanism


def register_kept_noise(calibration: KeptNoise) -> None:
  """Adds a calibration of the kept noise under its name (a new name other than
  'none', or the same bundle again)."""
  if not isinstance(calibration, KeptNoise):
    raise TypeError(f"register_kept_noise: {calibration!r} is not a KeptNoise")
  old = KEPT_NOISE.get(calibration.name)
  if calibration.name == "none" or (old is not None and old != calibration):
    raise ValueError(f"register_kept_noise: {calibration.name!r} is already registered")
  problem = kept_noise.check_bundle(calibration)
  if problem:
    raise ValueError(problem)
  KEPT_NOISE[calibration.name] = calibration
