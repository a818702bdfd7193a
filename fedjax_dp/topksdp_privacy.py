"""The privacy report for TopkSDP-FL's noise on kept coordinates (`kept_noise`).

Two figures, never mixed up:

* **The paper's chain** (labelled as the paper's): (epsilon / k, delta) per kept
  coordinate by the classical Gaussian calibration, so each client's report is
  (epsilon, k delta)-LDP per round (basic composition; the paper writes delta);
  shuffling the m reports of a round amplifies to (eps_c, delta_c) by FMT 2021
  Thm 3.8, which charges (e^eps_c + 1)(1 + e^-eps / 2) n k delta for the reports'
  delta (else none; none either when the run does not shuffle, `shuffle: none`);
  sampling clients with rate q amplifies again, eps' = ln(1 + q (e^eps_c - 1)),
  delta' = q delta_c; T rounds compose (basic, advanced, optimal). Every step's
  validity condition is checked and reported, and a delta >= 1 is vacuous.
* **The accountant's figure**: what the mechanism as simulated guarantees. It
  exists only when nothing escapes the noise: indices independent of the data
  (`random_k` from the key, `public_topk` from the previous global update) and
  the sent vector clipped in L2 (`final_clip_l2` C_f, which also bounds what
  error feedback carries from earlier rounds). Each participation is then a
  Gaussian on the sent vector with replace-one sensitivity 2 C_f; RDP composes
  over a client's participations with no amplification claimed (a local
  guarantee, against the server). With `topk` indices the upload reveals
  which coordinates were largest, unnoised: no epsilon can be given.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp import accounting, amplification
from fedjax_dp.pipeline import keep_count, kept_noise_draw, noise_clip


def _checked(b: amplification.Bound) -> dict:
  """A step's dict, marked invalid (vacuous) where its delta reaches 1."""
  d = b.to_dict()
  if b.delta >= 1 and b.valid:
    d.update(valid=False, reason=f"delta = {b.delta:.4g} >= 1: vacuous")
  return d


def papers_chain(cfg, k: int, rounds: int) -> dict:
  """The paper's (epsilon, delta) chain, step by step, each with its validity and its delta.

    1. each kept coordinate: (eps / k, delta) by the classical Gaussian calibration
       (valid for eps / k < 1);
    2. the client's report: k coordinates by basic composition, (eps, delta0),
       delta0 = k delta (the paper writes delta);
    3. shuffling (eps, delta0) reports: FMT 2021 Thm 3.8, (eps_c, delta_s +
       (e^eps_c + 1)(1 + e^-eps / 2) n delta0) with delta_s = delta; the pure-eps
       theorems (Thm 3.1, Erlingsson et al.) do not apply to Gaussian reports.
       Fixed cohorts: n = m. Poisson cohorts: n is random; a lower bound on n
       with its failure probability added to delta (amplification.shuffle_poisson).
       No theorem, or a vacuous one: no amplification, (eps, delta0);
    4. client sampling with rate q = m / N: (ln(1 + q (e^eps_c - 1)), q delta_c);
    5. T rounds: the smallest epsilon of basic, advanced and optimal composition
       (delta' = delta) whose delta is below 1.
  A step whose delta reaches 1 is marked invalid (vacuous); if every composition's
  does, the chain has no figure (`vacuous`, epsilon None)."""
  eps, delta = cfg.ldp_epsilon, cfg.ldp_delta
  m, q = cfg.clients_per_round, cfg.clients_per_round / cfg.num_clients
  steps = []
  eps_k = eps / k
  steps.append({"step": "per-coordinate budget epsilon / k", "epsilon": eps_k, "delta": delta,
                "valid": eps_k < 1,
                "note": "the classical Gaussian calibration sqrt(2 ln(1.25/delta)) / eps needs "
                        "eps < 1" + ("" if eps_k < 1 else f": violated (epsilon / k = {eps_k:g})")})
  client = amplification.compose_basic(eps_k, delta, k)
  delta0 = client.delta
  steps.append({"step": "client LDP per round (k coordinates, basic composition over them)",
                **_checked(client),
                "note": f"(epsilon / k, delta) on each of k = {k} coordinates composes to "
                        f"(epsilon, k delta) = ({client.epsilon:.4g}, {delta0:.4g}), not "
                        "(epsilon, delta); Gaussian reports are (eps, delta0)-LDP, never pure"})
  if cfg.shuffle == "none":
    # the paper's chain assumes its shuffler; a run without one gets no amplification
    shuffled = amplification.Bound(eps, delta0, "none", valid=False,
                                   reason="this run does not shuffle (shuffle: none): "
                                          "no amplification")
  elif delta0 >= 1:
    shuffled = amplification.Bound(eps, delta0, "none", valid=False,
                                   reason=f"the reports' delta0 = {delta0:.4g} >= 1: vacuous")
  elif cfg.sampling == "poisson":
    shuffled = amplification.shuffle_poisson(eps, cfg.num_clients, q, delta, delta0)
  else:
    shuffled = amplification.shuffle(eps, m, delta, delta0)
  what = (f"shuffling the {m} reports of a round" if cfg.sampling == "fixed" else
          f"shuffling a round's Poisson cohort (random size, mean {m})")
  steps.append({"step": what, **_checked(shuffled)})
  sub = amplification.subsample(shuffled.epsilon, shuffled.delta, q)
  steps.append({"step": f"client sampling, q = {q:g}", **_checked(sub)})
  composed = [amplification.compose_basic(sub.epsilon, sub.delta, rounds),
              amplification.compose_advanced(sub.epsilon, sub.delta, rounds, delta),
              amplification.compose_optimal(sub.epsilon, sub.delta, rounds, delta)]
  usable = [b for b in composed if b.delta < 1]
  best = min(usable or composed, key=lambda b: b.epsilon)
  steps.append({"step": f"{rounds} rounds", **_checked(best),
                "alternatives": [_checked(b) for b in composed]})
  label = ("the paper's chain (its own analysis, each step's delta as it follows; not a "
           "guarantee of this mechanism, see not_accounted)")
  if not usable:
    return {"label": label + f": vacuous, delta >= 1 after {rounds} rounds", "vacuous": True,
            "epsilon": None, "delta": best.delta, "steps": steps}
  return {"label": label, "vacuous": False, "epsilon": best.epsilon, "delta": best.delta,
          "steps": steps}


def topksdp_report(cfg, d: int, rounds: int, client_sizes) -> dict:
  k = keep_count(d, cfg.s_local)
  report: dict = {"mechanism": (
      f"top-k with error feedback (k = {k} of {d}, selection {cfg.index_selection}), Gaussian "
      f"noise on the kept coordinates ({cfg.kept_noise}), shuffle {cfg.shuffle}"),
      "k": k, "not_accounted": []}
  report["noise_draw"] = (
      "per client, from the client's own key" if kept_noise_draw(cfg) == "client" else
      "for the aggregate in one draw (simulation shortcut with the same distribution of the "
      "aggregate as per-client draws; the guarantee is the per-client mechanism's)")
  clip = noise_clip(cfg)
  # the std each round, relative to round 0's: the paper's calibration scales with
  # that round's learning rate (a cosine schedule shrinks the noise round by round)
  scale = np.ones(max(rounds, 1))
  if cfg.kept_noise == "multiplier":
    std_min = std_max = cfg.kept_noise_multiplier * clip
  else:
    factor = math.sqrt(2 * math.log(1.25 / cfg.ldp_delta)) * k / cfg.ldp_epsilon
    std_min = 2 * cfg.lr * clip / max(client_sizes) * factor
    std_max = 2 * cfg.lr * clip / min(client_sizes) * factor
    report["papers_chain"] = papers_chain(cfg, k, rounds)
    from fedjax_dp.simulation import learning_rate_schedule   # simulation imports this module's deps
    lr_at = learning_rate_schedule(cfg)
    scale = np.asarray([float(lr_at(t)) for t in range(max(rounds, 1))], np.float64) / cfg.lr
  report["noise_std"] = {"min_over_clients": std_min * float(scale.min()),
                         "max_over_clients": std_max * float(scale.max()),
                         "over_rounds": ("constant" if scale.min() == scale.max() else
                                         f"with the learning rate ({cfg.lr_schedule})")}
  complete = (cfg.index_selection in ("random_k", "public_topk") and cfg.final_clip_l2 is not None
              and std_min * float(scale.min()) > 0)
  if complete:
    z = std_min / (2 * cfg.final_clip_l2)  # replace-one sensitivity 2 C_f; the least-noised client
    # each round at its own noise: RDP of N(0, (z s_t)^2) is gaussian_rdp(z) / s_t^2
    rdp = accounting.gaussian_rdp(z) * float(np.sum(1.0 / np.square(scale[:max(rounds, 0)])))
    eps, order = accounting.epsilon_np(rdp, cfg.ldp_delta)
    z = z * float(scale.min())                                  # the least-noised round's
    report["accountant"] = {
        "complete": True,
        "epsilon": eps, "order": order, "delta": cfg.ldp_delta,
        "guarantee": (f"per client against the server: a client taking part in all {rounds} rounds "
                      f"is ({eps:.4g}, {cfg.ldp_delta:g})-DP for replace-one neighbours of its "
                      "data (RDP; no shuffling or sampling amplification claimed)"),
        "noise_multiplier": z,
        "why_complete": (f"indices from {'the key' if cfg.index_selection == 'random_k' else 'the previous global update'}"
                         f" (independent of the client's data) and the sent vector clipped to "
                         f"final_clip_l2 = {cfg.final_clip_l2:g}, so every upload is a Gaussian "
                         "mechanism with sensitivity 2 final_clip_l2"),
    }
  else:
    report["accountant"] = {"complete": False, "epsilon": None}
    if cfg.index_selection == "topk":
      report["not_accounted"].append(
          "data-dependent indices: the top-k positions are chosen from the private update and "
          "sent without noise (use index_selection random_k or public_topk)")
    if cfg.final_clip_l2 is None:
      report["not_accounted"].append(
          "the sent vector is not clipped: error feedback adds earlier rounds' residual, so its "
          "sensitivity is not bounded by the clip (set final_clip_l2)")
  if cfg.kept_noise == "paper":
    report["not_accounted"].append(
        "the paper's sensitivity 2 lr C / n_i covers one example in one SGD step, not a client's "
        f"update after {cfg.local_epochs} local epoch(s)")
  return report
