"""Local training objectives: one module per local term, a registry, the composite.

  base.py        the LocalTerm protocol (optax-style: a NamedTuple of functions
                 and static properties) and the inputs each function sees
  fedprox.py, contrastive.py, moon.py, scaffold.py, fedadmm.py, solo.py, feddyn.py
                 one term each
  registry.py    TERMS (name -> constructor), ALGORITHMS (presets), parse_algorithm
  objective.py   Objective: cross-entropy + the configured terms, as the round calls it

A new term is one file here plus one line in registry.TERMS (README: Extending).
"""

from fedjax_dp.algorithms.base import (FinishInputs, LocalContext, LocalTerm, LossInputs,
                                       ServerContext)
from fedjax_dp.algorithms.objective import Objective, of_terms
from fedjax_dp.algorithms.registry import (ALGORITHMS, TERMS, parse_algorithm, register_term,
                                           term_properties)
