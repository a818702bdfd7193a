"""The local terms by name (each a constructor that takes its numbers), and the
algorithm presets built from them.

TERMS is also the order in which terms add to the loss and finish after
training (the numbers of a combination do not depend on how the user spelled
it). A new term is one module and one line here.
"""

from __future__ import annotations

from typing import Callable

from fedjax_dp.algorithms.base import LocalTerm
from fedjax_dp.algorithms.contrastive import contrastive
from fedjax_dp.algorithms.fedadmm import fedadmm
from fedjax_dp.algorithms.feddyn import feddyn
from fedjax_dp.algorithms.fedprox import fedprox
from fedjax_dp.algorithms.moon import moon
from fedjax_dp.algorithms.scaffold import scaffold
from fedjax_dp.algorithms.solo import solo

# name -> constructor (keyword numbers -> LocalTerm); constructor() has the defaults
TERMS: dict[str, Callable[..., LocalTerm]] = {
    "fedprox": fedprox,
    "contrastive": contrastive,
    "moon": moon,
    "scaffold": scaffold,
    "fedadmm": fedadmm,
    "solo": solo,
    "feddyn": feddyn,
}

# algorithm name -> (the local terms it adds, the server optimizer it implies); every
# term is also an algorithm of its own with the sgd server
ALGORITHMS: dict[str, tuple[tuple[str, ...], str]] = {
    "fedavg": ((), "sgd"),
    "fedavgm": ((), "momentum"),
    "fedadam": ((), "adam"),
    **{name: ((name,), "sgd") for name in TERMS},
    "topksdp": (("contrastive",), "sgd"),
}


def register_term(term: LocalTerm | Callable[..., LocalTerm],
                  server_optimizer: str = "sgd") -> None:
  """Adds a term (and the algorithm of its name) at run time, e.g. from user code:
  its constructor (keyword numbers -> LocalTerm), or a LocalTerm whose numbers are
  fixed. It adds to the loss after the built-in terms."""
  make = term if callable(term) else (lambda: term)
  name = _built(make, "term").name
  if name in ALGORITHMS:
    raise ValueError(f"a term or algorithm {name!r} is already registered")
  TERMS[name] = make
  ALGORITHMS[name] = ((name,), server_optimizer)


def _built(make: Callable, kind: str):
  """make() for registering: a constructor must build its stage from its defaults
  (a run without a config key for a number uses the default)."""
  try:
    return make()
  except TypeError as e:
    raise ValueError(f"a {kind} constructor must build its stage with no arguments, each "
                     f"number with a default ({e})") from None


def term_properties(name: str) -> LocalTerm:
  """The registered term `name` at its constructor's defaults: its static properties
  (which do not depend on its numbers)."""
  return TERMS[name]()


def parse_algorithm(name: str) -> tuple[tuple[str, ...], str]:
  """'contrastive+scaffold' -> (('contrastive', 'scaffold'), 'sgd'); raises ValueError."""
  parts = [p.strip() for p in name.split("+") if p.strip()]
  bad = [p for p in parts if p not in ALGORITHMS]
  if not parts or bad:
    raise ValueError(f"algorithm {name!r}: allowed are {', '.join(ALGORITHMS)}, or a '+'-joined "
                     "combination of local terms (e.g. fedprox+scaffold)")
  terms, server = [], "sgd"
  for p in parts:
    t, s = ALGORITHMS[p]
    terms += [x for x in t if x not in terms]
    server = s if s != "sgd" else server
  for t in terms:
    term = term_properties(t)
    if term.own_model and len(parts) > 1:
      raise ValueError(f"algorithm {name!r}: {t} (each client trains alone) combines with "
                       "nothing")
    clash = [x for x in term.excludes if x in terms]
    if clash:
      raise ValueError(f"algorithm {name!r}: {t} does not combine with {clash[0]} "
                       f"({term.exclusion_reason})")
  return tuple(terms), server
