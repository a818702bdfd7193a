"""The privacy report for TopkSDP-FL's noise on kept coordinates (`kept_noise`).

Two figures, never mixed up:

* **The paper's chain** (labelled as the paper's): each client is epsilon-LDP
  per round with epsilon / k per kept coordinate and the classical Gaussian
  calibration; shuffling the m reports of a round amplifies to (eps_c, delta)
  (the tightest valid of FMT 2021 and Erlingsson et al. 2019, else none; none
  either when the run does not shuffle, `shuffle: none`);
  sampling clients with rate q amplifies again, eps' = ln(1 + q (e^eps_c - 1)),
  delta' = q delta; T rounds compose (basic, advanced, optimal). Every step's
  validity condition is checked and reported.
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


def papers_chain(cfg, k: int, rounds: int) -> dict:
  """The paper's (epsilon, delta) chain, step by step, each with its validity."""
  eps, delta = cfg.ldp_epsilon, cfg.ldp_delta
  m, q = cfg.clients_per_round, cfg.clients_per_round / cfg.num_clients
  steps = []
  eps_k = eps / k
  steps.append({"step": "per-coordinate budget epsilon / k", "epsilon": eps_k,
                "valid": eps_k < 1,
                "note": "the classical Gaussian calibration sqrt(2 ln(1.25/delta)) / eps needs "
                        "eps < 1" + ("" if eps_k < 1 else f": violated (epsilon / k = {eps_k:g})")})
  steps.append({"step": "client LDP per round (k coordinates, basic composition over them)",
                "epsilon": eps, "delta": delta, "valid": True,
                "note": "Gaussian noise gives (eps, delta)-LDP, not pure eps-LDP; the pure-eps0 "
                        "shuffle theorems need the (eps0, delta0) form (FMT 2021 Thm 3.8 pays "
                        "n delta0)"})
  if cfg.shuffle == "none":
    # the paper's chain assumes its shuffler; a run without one gets no amplification
    shuffled = amplification.Bound(eps, 0.0, "none", valid=False,
                                   reason="this run does not shuffle (shuffle: none): "
                                          "no amplification")
  else:
    shuffled = amplification.shuffle(eps, m, delta)
  steps.append({"step": f"shuffling the {m} reports of a round", **shuffled.to_dict()})
  eps_c = shuffled.epsilon
  delta_c = shuffled.delta if shuffled.valid else delta
  sub = amplification.subsample(eps_c, delta_c, q)
  steps.append({"step": f"client sampling, q = {q:g}", **sub.to_dict()})
  composed = [amplification.compose_basic(sub.epsilon, sub.delta, rounds),
              amplification.compose_advanced(sub.epsilon, sub.delta, rounds, delta),
              amplification.compose_optimal(sub.epsilon, sub.delta, rounds, delta)]
  best = min(composed, key=lambda b: b.epsilon)
  steps.append({"step": f"{rounds} rounds", **best.to_dict(),
                "alternatives": [b.to_dict() for b in composed]})
  return {"label": "the paper's chain (its own analysis; not a guarantee of this mechanism, see "
                   "not_accounted)",
          "epsilon": best.epsilon, "delta": best.delta, "steps": steps}


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
