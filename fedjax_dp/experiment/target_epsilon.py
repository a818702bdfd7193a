"""What target_epsilon allows a run: how many rounds, and the noise of the rounds a resume adds.

Both are checked on the host before anything is written: `budget_rounds` for
a fresh or resumed run, `calibrated_multiplier` when a resume changes `rounds`
under a noise multiplier calibrated to the target.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.recipes.privacy import event_rdp, noise_multiplier_for, sampling_rate
from fedjax_dp.errors import RunError
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import get_mechanism


def budget_rounds(cfg: Config, spent_rdp=None, done: int = 0,
                  accounted: float | None = None) -> int:
  """Rounds the run may take, checked before anything is written.

  Central DP with target_epsilon: the most rounds whose accounted epsilon stays
  <= the target (the run stops before passing it). Local DP: all of them (each
  client stops on its own), but one participation must fit in the target. Also
  raises RunError for an unreachable target (make_privacy refuses an impossible
  adaptive-clipping set-up, with the clip layout). A resumed run passes what its `done` rounds spent (`spent_rdp`
  [orders], the restored ledger); the rounds to come run at `accounted`
  (default: the config's multiplier)."""
  mechanism = get_mechanism(cfg.dp)
  if not mechanism.private:
    return cfg.rounds
  try:
    z = noise_multiplier_for(cfg) if accounted is None else accounted
  except ValueError as e:  # target epsilon out of reach
    raise RunError(str(e))
  if cfg.target_epsilon is None:
    return cfg.rounds
  if cfg.clip_parts == "tiers" or cfg.noise_schedule != "static":
    # the event depends on the tier layout and the controller: local DP checks one
    # participation after setup; central DP skips the round that would pass the target
    return cfg.rounds
  event = event_rdp(cfg, z)
  if mechanism.charged_once:   # one mechanism over the run (correlated noise): all or none
    if accounting.epsilon_np(event, cfg.delta)[0] > cfg.target_epsilon:
      raise RunError(f"target_epsilon {cfg.target_epsilon:g} is below the run's epsilon "
                     f"{accounting.epsilon_np(event, cfg.delta)[0]:.4g} at noise multiplier "
                     f"{z:g} (dp {cfg.dp!r}: one mechanism over all {cfg.rounds} rounds, built "
                     "for them): raise noise_multiplier or target_epsilon, or leave "
                     "noise_multiplier null to calibrate it")
    return cfg.rounds
  if mechanism.per_client_ledgers or spent_rdp is None:
    spent_rdp, done = np.zeros_like(event), 0   # local DP: each client's own ledger decides
  before = np.asarray(spent_rdp, np.float64)
  # the in-round float32 ledger rounds up, by at most ~2 ulp (2.4e-7) per round:
  # stop where even that upper bound stays within the target
  ok = lambda t: accounting.epsilon_np((before + (t - done) * event) * (1 + 2.4e-7 * t),
                                       cfg.delta)[0] <= cfg.target_epsilon
  if done >= cfg.rounds or not ok(done + 1):
    if done:
      return done   # a resumed run whose budget is spent: no round more
    what = "one participation's" if mechanism.per_client_ledgers else "one round's"
    raise RunError(f"target_epsilon {cfg.target_epsilon:g} is below {what} epsilon "
                   f"{accounting.epsilon_np(event, cfg.delta)[0]:.4g} at noise multiplier "
                   f"{z:g}: raise noise_multiplier or target_epsilon")
  if mechanism.per_client_ledgers:
    return cfg.rounds
  lo, hi = done + 1, cfg.rounds  # epsilon grows with t: find the last t with ok(t)
  if ok(hi):
    return hi
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if ok(mid) else (lo, mid)
  return lo


def calibrated_multiplier(cfg: Config, spent_rdp: np.ndarray, done: int) -> float:
  """Central DP with target_epsilon: the accounted noise multiplier for the
  `rounds - done` rounds still to run after `done` rounds spent `spent_rdp`
  [orders] (the restored ledger), so that all `rounds` together stay within the
  target. The rounds already run keep the noise they had; `noise_multiplier_for`
  is the case of nothing spent."""
  remaining = cfg.rounds - done
  aim = cfg.target_epsilon * (1.0 - 1e-5 - 3e-7 * cfg.rounds)
  used = accounting.epsilon_np(spent_rdp, cfg.delta)[0]
  if used >= aim:
    raise RunError(f"--resume: the {done} rounds already run spent epsilon {used:.4g} of "
                   f"target_epsilon {cfg.target_epsilon:g}: no room for more rounds")
  try:
    return accounting.calibrate_noise_multiplier(
        aim, sampling_rate(cfg), remaining, cfg.delta,
        epsilon_fn=lambda z: accounting.epsilon_np(
            spent_rdp + remaining * event_rdp(cfg, z), cfg.delta)[0])
  except ValueError as e:
    raise RunError(f"--resume: {e} for the {remaining} rounds after the {done} already run")
