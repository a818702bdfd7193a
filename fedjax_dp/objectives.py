"""Local objectives: the old module name, re-exporting fedjax_dp.algorithms.

Each local term is now one module in fedjax_dp/algorithms/ (fedprox,
contrastive, moon, scaffold, fedadmm, solo, feddyn) implementing the LocalTerm
protocol (algorithms/base.py); the composite Objective the round calls is in
algorithms/objective.py, and the registry and presets in algorithms/registry.py.
"""

from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms import (ALGORITHMS, TERMS, FinishInputs, LocalContext, LocalTerm,
                                  LossInputs, ServerContext, make_objective, objective_for,
                                  parse_algorithm)
from fedjax_dp.algorithms import Objective as CompositeObjective
from fedjax_dp.algorithms.base import contrastive_nll, cosine as _cosine, dot as _dot, \
    sq_dist as _sq_dist
from fedjax_dp.algorithms.contrastive import bounded_push

__all__ = ["ALGORITHMS", "TERMS", "FinishInputs", "LocalContext", "LocalTerm", "LossInputs",
           "ServerContext", "Objective", "CompositeObjective", "make_objective",
           "objective_for", "parse_algorithm", "bounded_push", "contrastive_nll"]


def Objective(terms=(), prox_mu: float = 0.001, contrastive_form: str = "bounded",
              mu1: float = 0.01, mu2: float = 0.005, radius: float = 1.0,
              contrastive_tau: float = 0.5, moon_mu: float = 1.0, moon_tau: float = 0.5,
              rho: float = 0.01, momentum: float = 0.0, feddyn_alpha: float = 0.01
              ) -> CompositeObjective:
  """The old constructor, by term names and the old keyword names (tests, scripts)."""
  from fedjax_dp.config import Config
  cfg = dataclasses.replace(
      Config(), prox_mu=prox_mu, contrastive_form=contrastive_form, contrastive_mu1=mu1,
      contrastive_mu2=mu2, contrastive_radius=radius, contrastive_tau=contrastive_tau,
      moon_mu=moon_mu, moon_tau=moon_tau, admm_rho=rho, momentum=momentum,
      feddyn_alpha=feddyn_alpha)
  return objective_for(tuple(terms), cfg)
