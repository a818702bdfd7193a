"""The privacy report's local-DP section: per-client epsilons, budgets, per-cluster noise, PLD.

Under local DP every client noises its own update and keeps its own ledger:
the report gives the largest client's epsilon and the spread over clients,
the allocated budgets, cluster noise, and the dynamic-DP paper's own
per-client formula (not a guarantee). privacy_report.py assembles the report.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.core.simulation import Simulation
from fedjax_dp.recipes.hparams import budget_limit
from fedjax_dp.recipes.flat import local_noise_draw
from fedjax_dp.privacy import accounting
from fedjax_dp.experiment.reports.privacy_report import add_pld, finite_or_none, uses_dynamic_dp
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.privacy import cohort_sampling


CLIENT_EPSILONS = "client_epsilons.csv"   # beside summary.json (30,000 clients: 784 KB of
                                          # summary.json before, the first-hour review)


def client_epsilon_rows(sim: Simulation, state) -> list[dict]:
  """The rows of client_epsilons.csv: each client's id, epsilon (empty where none is
  finite) and participations."""
  eps, _ = sim.epsilons(state)
  counts = np.asarray(state.server_state["noise_control"]["participations"])
  return [{"client": i, "epsilon": finite_or_none(e), "participations": int(n)}
          for i, (e, n) in enumerate(zip(np.asarray(eps, np.float64), counts))]


def read_client_epsilons(run_dir: str) -> list[float | None]:
  """[num_clients] each client's epsilon from a local-DP run's client_epsilons.csv
  (None where it has none)."""
  import csv
  import os
  with open(os.path.join(run_dir, CLIENT_EPSILONS), newline="") as f:
    return [float(r["epsilon"]) if r["epsilon"] else None for r in csv.DictReader(f)]


def clients_spent(sim: Simulation, state) -> np.ndarray:
  """[num_clients] bool: local DP clients whose next participation would pass the target."""
  cfg = sim.cfg
  if not get_mechanism(cfg.dp).per_client_ledgers or cfg.target_epsilon is None:
    return np.zeros(cfg.num_clients, bool)
  after = np.asarray(state.privacy.ledger, np.float64) + sim.next_event_rdp(state)
  return accounting.epsilons_np(after, cfg.delta)[0] > budget_limit(sim.client_budgets())


def local_section(report: dict, cfg: Config, sim: Simulation, state) -> None:
  z = sim.noise_multiplier
  eps, _ = sim.epsilons(state)
  nc = state.server_state["noise_control"]
  counts = np.asarray(nc["participations"]) if z > 0 else None
  spent = clients_spent(sim, state)
  report.update({
      **get_mechanism(cfg.dp).describe(cohort_sampling(cfg)),
      "epsilon": finite_or_none(np.max(eps)), "epsilon_is": "the largest client's",
      "clients": {
          "epsilon_min": finite_or_none(np.min(eps)),
          "epsilon_median": finite_or_none(np.median(eps)),
          "epsilon_max": finite_or_none(np.max(eps)),
          "epsilons": f"{CLIENT_EPSILONS}: each client's epsilon and participations",
          "participations": ({"min": int(counts.min()), "median": float(np.median(counts)),
                              "max": int(counts.max())} if counts is not None else None),
          "spent": int(spent.sum()),
          "stopped_by_budget": "clients stop taking part when their next participation "
                               "would pass target_epsilon" if cfg.target_epsilon else None},
      "noise_draw": (
          "per report, from the client's own key" if local_noise_draw(cfg) == "client" else
          "for the sum of the reports in one draw (a simulation shortcut with the same "
          "distribution of the released mean as per-report draws, taken where nothing reads "
          "a single report; the guarantee is the per-report mechanism's)"),
  })
  if cfg.accountant == "pld" and z > 0 and counts.max() > 0:
    # static noise (config): every participation is a Gaussian of at least the composed
    # multiplier (cluster_noise only adds), so the most frequent client's count bounds all;
    # checked against the ledgers: rounds run with other hyperparameters (with_hparams on
    # another simulation) must not be reported at this one's noise
    from fedjax_dp.privacy.planning import pld_epsilon
    z_acc = sim.privacy.accounted_noise_multiplier
    bound = counts[:, None] * np.asarray(sim.privacy.event_rdp, np.float64)[None, :]
    ledger = np.asarray(state.privacy.ledger, np.float64)
    if np.all(ledger <= bound * (1 + 1e-5) + 1e-7):
      add_pld(report, lambda: pld_epsilon(1.0, z_acc / 2, int(counts.max()), cfg.delta),
              "rdp ledgers in the round; largest client's figure by PLD")
    else:
      report["pld_epsilon"] = None
      report["pld_note"] = ("no PLD figure: the ledgers hold more than this simulation's noise "
                            "gives for the clients' participations (rounds ran with other "
                            "hyperparameters); epsilon is the RDP ledgers'")
  budgets = sim.client_budgets()
  if cfg.client_budgets == "allocated":
    report["client_budgets"] = {
        "method": "projected gradient ascent with momentum (eta 0.01, mu 0.9) on "
                  "sum_i 1 - exp(-gamma_i eps_i), gamma_i = n_i / mean n, sum eps_i <= "
                  "num_clients * target_epsilon, each eps_i in its sensitivity tier's range",
        "min": float(budgets.min()), "median": float(np.median(budgets)),
        "max": float(budgets.max()), "sum": float(budgets.sum()),
        "budgets": budgets.tolist()}
    report["clients"]["stopped_by_budget"] = ("clients stop taking part when their next "
                                              "participation would pass their own budget")
  if sim.recipe.rule.client_noise is not None:   # per-cluster noise: the rule's state
    cn = state.server_state["aggregator"]
    f = np.asarray(sim.recipe.rule.client_noise(cn), np.float64)
    rule = sim.recipe.rule.name
    report["cluster_noise"] = {
        "method": ("per-cluster noise: a client last seen in a cluster of s members noises "
                   "with z sqrt(s / median cluster size), never below z; its own ledger "
                   "composes the noise it really used" if rule == "cluster" else
                   f"per-client noise set by aggregator {rule!r}: each client noises with z "
                   "times its factor from the rule's state; its own ledger composes the "
                   "noise it really used"),
        "next_round_factor": {"min": float(f.min()), "median": float(np.median(f)),
                              "max": float(f.max())},
        **({"last_median_cluster_size": float(cn["median"])}
           if isinstance(cn, dict) and "median" in cn else {})}
  if z > 0 and uses_dynamic_dp(cfg):
    paper = np.asarray(nc["paper_epsilon"], np.float64)
    report["paper_formula_epsilon"] = {
        "is": "NOT a guarantee: the dynamic-DP paper's per-round charge "
              "sqrt(2 ln(1.25/delta)) / z_round, summed over each client's participations "
              "(its calibration needs epsilon < 1 per round, and the sum ignores delta)",
        "max": float(paper.max()), "median": float(np.median(paper))}
