"""The local terms by name, and the algorithm presets built from them.

TERMS is also the order in which terms add to the loss and finish after
training (the numbers of a combination do not depend on how the user spelled
it). A new term is one module and one line here.
"""

from __future__ import annotations

from fedjax_dp.algorithms import contrastive, fedadmm, feddyn, fedprox, moon, scaffold, solo
from fedjax_dp.algorithms.base import LocalTerm

TERMS: dict[str, LocalTerm] = {t.name: t for t in (
    fedprox.TERM,
    contrastive.TERM,
    moon.TERM,
    scaffold.TERM,
    fedadmm.TERM,
    solo.TERM,
    feddyn.TERM,
)}

# algorithm name -> (the local terms it adds, the server optimizer it implies); every
# term is also an algorithm of its own with the sgd server
ALGORITHMS: dict[str, tuple[tuple[str, ...], str]] = {
    "fedavg": ((), "sgd"),
    "fedavgm": ((), "momentum"),
    "fedadam": ((), "adam"),
    **{name: ((name,), "sgd") for name in TERMS},
    "topksdp": (("contrastive",), "sgd"),
}


def register_term(term: LocalTerm, server_optimizer: str = "sgd") -> None:
  """Adds `term` (and the algorithm of its name) at run time, e.g. from user code;
  it adds to the loss after the built-in terms."""
  if term.name in ALGORITHMS:
    raise ValueError(f"a term or algorithm {term.name!r} is already registered")
  TERMS[term.name] = term
  ALGORITHMS[term.name] = ((term.name,), server_optimizer)


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
    if TERMS[t].own_model and len(parts) > 1:
      raise ValueError(f"algorithm {name!r}: {t} (each client trains alone) combines with "
                       "nothing")
    clash = [x for x in TERMS[t].excludes if x in terms]
    if clash:
      raise ValueError(f"algorithm {name!r}: {t} does not combine with {clash[0]} "
                       f"({TERMS[t].exclusion_reason})")
  return tuple(terms), server


def resolve(names, cfg) -> tuple[LocalTerm, ...]:
  """The terms `names` lists, in TERMS order, each in the variant cfg picks."""
  chosen = [TERMS[n] for n in TERMS if n in names]
  return tuple(t.configure(cfg) if t.configure is not None else t for t in chosen)
