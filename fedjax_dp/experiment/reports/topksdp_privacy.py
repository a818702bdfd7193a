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

from typing import Sequence

import numpy as np

from fedjax_dp.core.schedules import learning_rate_schedule
from fedjax_dp.privacy import accounting, amplification
from fedjax_dp.compression.pipeline import keep_count
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp.recipes.flat import kept_noise_draw, kept_noise_of, kept_noise_settings, noise_clip


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
  label = ("the paper's chain (its own analysis, each step's delta as it follows; not a "
           "guarantee of this mechanism, see not_accounted)")
  if rounds <= 0:   # nothing released yet (a run stopped before its first round)
    return {"label": label + ": no round ran", "vacuous": False, "epsilon": 0.0, "delta": 0.0,
            "steps": steps}
  composed = [amplification.compose_basic(sub.epsilon, sub.delta, rounds),
              amplification.compose_advanced(sub.epsilon, sub.delta, rounds, delta),
              amplification.compose_optimal(sub.epsilon, sub.delta, rounds, delta)]
  usable = [b for b in composed if b.delta < 1]
  best = min(usable or composed, key=lambda b: b.epsilon)
  steps.append({"step": f"{rounds} rounds", **_checked(best),
                "alternatives": [_checked(b) for b in composed]})
  if not usable:
    return {"label": label + f": vacuous, delta >= 1 after {rounds} rounds", "vacuous": True,
            "epsilon": None, "delta": best.delta, "steps": steps}
  return {"label": label, "vacuous": False, "epsilon": best.epsilon, "delta": best.delta,
          "steps": steps}


def gaussian_pair_rdp(s1, s2, dim: int, shift: float,
                      orders=accounting.DEFAULT_ORDERS) -> np.ndarray:
  """Renyi divergence D_a(N(m1, s1^2 I_dim) || N(m2, s2^2 I_dim)), ||m1 - m2|| = shift,
  for each order a > 1 (s1, s2 broadcast against the orders on a last axis):

    s_a^2 = a s2^2 + (1 - a) s1^2 = s1^2 (1 + a (r^2 - 1)),  r = s2 / s1,
    D_a = a shift^2 / (2 s_a^2) + dim (2 a ln r - ln(1 + a (r^2 - 1))) / (2 (a - 1)),

  the closed form of the univariate Gaussians' divergence, summed over dim
  independent coordinates (the shift along one of them); infinite where
  s_a^2 <= 0 (orders a >= s1^2 / (s1^2 - s2^2) when s1 > s2)."""
  a = np.asarray(orders, np.float64)
  s1 = np.asarray(s1, np.float64)[..., None]
  s2 = np.asarray(s2, np.float64)[..., None]
  r2m1 = (s2 - s1) * (s2 + s1) / s1 ** 2           # r^2 - 1 without cancellation
  base = 1 + a * r2m1                              # s_a^2 / s1^2
  with np.errstate(divide="ignore", invalid="ignore"):
    d = (a * shift ** 2 / (2 * s1 ** 2 * base)
         + dim * (a * np.log1p(r2m1) - np.log(base)) / (2 * (a - 1)))
  return np.where(base > 0, d, np.inf)


def size_leak(std_one: float, shift: float, k: int, sizes, scale, delta: float) -> dict:
  """What the paper's noise std reveals about a client's size n_i, as (epsilon, delta)
  for neighbours whose sizes differ by one example.

  The std of a client of n examples in round t is std_one s_t / n (std_one = 2 lr C
  factor at round 0's learning rate). For each client size n present and each
  neighbour pair (n - 1, n), (n, n + 1), over all T rounds, by RDP in each direction:
    sum_t D_a(N(., (std_one s_t / n1)^2 I_k) || N(., (std_one s_t / n2)^2 I_k)),
  whose variance part is the same every round (it depends on n2 / n1 only) and
  whose mean part (shift = the sent vector's sensitivity) scales with 1 / s_t^2.
  Returns the worst pair, and the same pair's epsilon with the std held fixed
  (the mean part alone, the accountant's model)."""
  scale = np.asarray(scale, np.float64)
  n = np.unique(np.asarray(sizes, np.int64))
  lo = np.concatenate([n, n[n >= 2] - 1]).astype(np.float64)
  hi = lo + 1
  rounds, inv2 = len(scale), float(np.sum(1.0 / np.square(scale)))
  s_lo, s_hi = std_one / lo, std_one / hi

  def rdp(s1, s2):   # one direction: T rounds of the variance part, the mean part at each std
    mean = inv2 * gaussian_pair_rdp(s1, s2, 0, shift) if shift else 0.0
    return rounds * gaussian_pair_rdp(s1, s2, k, 0.0) + mean

  e_fwd, o_fwd = accounting.epsilons_np(rdp(s_lo, s_hi), delta)
  e_bwd, o_bwd = accounting.epsilons_np(rdp(s_hi, s_lo), delta)
  eps = np.maximum(e_fwd, e_bwd)
  i = int(np.argmax(eps))
  fixed = (accounting.epsilon_np(inv2 * gaussian_pair_rdp(s_hi[i], s_hi[i], 0, shift), delta)[0]
           if shift else 0.0)
  return {"epsilon": float(eps[i]), "delta": delta,
          "order": float(o_fwd[i] if e_fwd[i] >= e_bwd[i] else o_bwd[i]),
          "n": int(lo[i]), "vs": int(hi[i]), "rounds": rounds,
          "epsilon_std_fixed": float(fixed),
          "mean_shift": shift}


def topksdp_report(cfg, d: int, rounds: int, client_sizes,
                   round_lrs: Sequence[float] | None = None) -> dict:
  """The kept-noise privacy report for a run of `rounds` rounds.

  round_lrs: the learning rate of each round actually run (as the rounds recorded
  it); the paper's std in round t is then round_lrs[t] / lr times round 0's at lr.
  Without it the schedule is recomputed from `cfg`, which is wrong for a run
  resumed with another `rounds` under a schedule that depends on it (cosine)."""
  if round_lrs is not None and len(round_lrs) != rounds:
    raise ValueError(f"round_lrs has {len(round_lrs)} entries: expected one per round run "
                     f"({rounds})")
  kept = kept_noise_of(cfg)
  k = keep_count(d, cfg.s_local)
  report: dict = {"mechanism": (
      f"top-k with error feedback (k = {k} of {d}, selection {cfg.index_selection}), Gaussian "
      f"noise on the kept coordinates ({kept.name}), shuffle {cfg.shuffle}"),
      "k": k, "not_accounted": []}
  report["noise_draw"] = (
      "per client, from the client's own key" if kept_noise_draw(cfg) == "client" else
      "for the aggregate in one draw (simulation shortcut with the same distribution of the "
      "aggregate as per-client draws; the guarantee is the per-client mechanism's)")
  clip = noise_clip(cfg)
  # the std each round, relative to round 0's: the paper's calibration scales with
  # that round's learning rate (a cosine schedule shrinks the noise round by round)
  settings = kept_noise_settings(cfg, kept)
  # every client size's std at round 0's lr (kept_noise.problem holds a calibration to
  # a std constant in n or proportional to 1 / n)
  stds = [kept_noise.report_std(kept, settings, clip, k, cfg.lr, n)
          for n in sorted(set(client_sizes))]
  std_min, std_max = min(stds), max(stds)
  if kept.papers_chain:
    report["papers_chain"] = papers_chain(cfg, k, rounds)
  scale = (_learning_rate_scale(cfg, rounds, round_lrs) if kept.follows_lr else
           np.ones(max(rounds, 1)))
  report["noise_std"] = {"min_over_clients": std_min * float(scale.min()),
                         "max_over_clients": std_max * float(scale.max()),
                         "over_rounds": ("constant" if scale.min() == scale.max() else
                                         "with the learning rate (" + (
                                             "as recorded by the rounds" if round_lrs is not None
                                             else cfg.lr_schedule) + ")")}
  report["accountant"], unaccounted = _accountants_figure(cfg, kept, std_min, scale, rounds)
  report["not_accounted"] += unaccounted
  if kept.papers_chain:
    report["not_accounted"].append(
        "the paper's sensitivity 2 lr C / n_i covers one example in one SGD step, not a "
        f"client's update after {cfg.local_epochs} local epoch(s)")
  if kept.reveals_size and rounds > 0:
    report["size_leak"] = _size_leak(cfg, std_min, k, client_sizes, scale, rounds)
    report["not_accounted"].append(_size_leak_caveat(cfg, kept, report["size_leak"], rounds))
  return report


def _learning_rate_scale(cfg, rounds: int, round_lrs: Sequence[float] | None) -> np.ndarray:
  """The paper's std each round relative to round 0's at lr: each round's learning
  rate / lr, as the rounds recorded it, else from the config's schedule."""
  if round_lrs is not None and rounds > 0:   # as run, whatever the config says now
    return np.asarray(round_lrs, np.float64) / cfg.lr
  lr_at = learning_rate_schedule(cfg.lr_schedule, cfg.lr, cfg.lr_min, cfg.rounds)
  return np.asarray([float(lr_at(t)) for t in range(max(rounds, 1))], np.float64) / cfg.lr


def _accountants_figure(cfg, kept, std_min: float, scale: np.ndarray,
                        rounds: int) -> tuple[dict, list[str]]:
  """The accountant's section, and why it has no figure when it has none (the
  not-accounted entries for data-dependent indices and an unclipped sent vector)."""
  complete = (cfg.index_selection in ("random_k", "public_topk") and cfg.final_clip_l2 is not None
              and std_min * float(scale.min()) > 0)
  if not complete:
    unaccounted = []
    if cfg.index_selection == "topk":
      unaccounted.append(
          "data-dependent indices: the top-k positions are chosen from the private update and "
          "sent without noise (use index_selection random_k or public_topk)")
    if cfg.final_clip_l2 is None:
      unaccounted.append(
          "the sent vector is not clipped: error feedback adds earlier rounds' residual, so its "
          "sensitivity is not bounded by the clip (set final_clip_l2)")
    return {"complete": False, "epsilon": None}, unaccounted
  z = std_min / (2 * cfg.final_clip_l2)  # replace-one sensitivity 2 C_f; the least-noised client
  # each round at its own noise: RDP of N(0, (z s_t)^2) is gaussian_rdp(z) / s_t^2
  rdp = accounting.gaussian_rdp(z) * float(np.sum(1.0 / np.square(scale[:max(rounds, 0)])))
  eps, order = accounting.epsilon_np(rdp, cfg.ldp_delta)
  z = z * float(scale.min())                                  # the least-noised round's
  return {
      "complete": True,
      "epsilon": eps, "order": order, "delta": cfg.ldp_delta,
      "guarantee": (f"per client against the server: a client taking part in all {rounds} rounds "
                    f"is ({eps:.4g}, {cfg.ldp_delta:g})-DP for replace-one neighbours of its "
                    "data (RDP; no shuffling or sampling amplification claimed)"
                    + ("; only for neighbours with the same number of examples n_i: the "
                       "paper's noise std depends on n_i (see size_leak)"
                       if kept.reveals_size else "")),
      "noise_multiplier": z,
      "why_complete": (f"indices from {'the key' if cfg.index_selection == 'random_k' else 'the previous global update'}"
                       f" (independent of the client's data) and the sent vector clipped to "
                       f"final_clip_l2 = {cfg.final_clip_l2:g}, so every upload is a Gaussian "
                       "mechanism with sensitivity 2 final_clip_l2"),
  }, []


def _size_leak(cfg, std_min: float, k: int, client_sizes, scale: np.ndarray,
               rounds: int) -> dict:
  """size_leak for a std that follows the client's size n_i (std_min: the largest
  client's at round 0)."""
  # the std is a function of n_i: neighbours that add or remove an example change the
  # noise level itself, which no fixed-sigma accountant sees
  shift = 2 * cfg.final_clip_l2 if cfg.final_clip_l2 is not None else 0.0
  return size_leak(std_min * max(client_sizes), shift, k, client_sizes, scale[:rounds],
                   cfg.ldp_delta)


def _size_leak_caveat(cfg, kept, leak: dict, rounds: int) -> str:
  """The not-accounted line of size_leak: what the std reveals of n_i."""
  relink = (", and re-links a client's layers after the per-layer shuffler"
            if cfg.shuffle != "none" else "")
  fixed = (f" (against {leak['epsilon_std_fixed']:.3g} with the std held fixed)"
           if leak["mean_shift"] else
           " from the noise level alone (the sent vector is not clipped: set final_clip_l2)")
  return (f"the client's size: the noise std {kept.std_says} reveals n_i{relink}; for "
          f"neighbours with n = {leak['n']} and {leak['vs']} examples it is "
          f"({leak['epsilon']:.3g}, {cfg.ldp_delta:g})-DP over {rounds} rounds{fixed} (Renyi "
          "divergence of Gaussians with different variances)")
