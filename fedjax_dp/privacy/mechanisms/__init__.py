"""Privacy mechanisms, one module each, registered by the config's `dp` name.

  no_privacy        'none'     the uploads as they are, FedAvg's weighted mean
  central_gaussian  'central'  the trusted server clips and noises the sum (DP-FedAvg)
  local_gaussian    'local'    each client clips and noises its own report

A mechanism is a `Mechanism` bundle (base.py): the round's functions (plan,
admit, client half, release) and the static properties the round and the
recipes' checks read. `register_mechanism(m)` adds one from the user's code.
"""

from __future__ import annotations

from fedjax_dp.privacy.mechanisms.base import (DIVIDES_BY, Admission, CohortSampling, Mechanism,
                                               Plan, RoundSetup)
from fedjax_dp.privacy.mechanisms import central_gaussian, local_gaussian, no_privacy

__all__ = ["DIVIDES_BY", "MECHANISMS", "Admission", "CohortSampling", "Mechanism", "Plan",
           "RoundSetup", "get_mechanism", "register_mechanism"]

MECHANISMS: dict[str, Mechanism] = {
    "none": no_privacy.no_privacy(),
    "central": central_gaussian.central_gaussian(),
    "local": local_gaussian.local_gaussian(),
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
