"""`fedjax-dp account`: plan a private run before running it.

  fedjax-dp account --q Q --noise-multiplier Z --steps T --delta D [--accountant rdp|pld]
                    [--sampling poisson|fixed --population N] [--json]
  fedjax-dp account --q Q --target-epsilon E --steps T --delta D [...]

Poisson sampling (rate q) is accounted for add/remove-one neighbours, with L2
sensitivity C. Fixed-size sampling (exactly m = q N of N, without replacement)
is accounted for replace-one neighbours (Wang, Balle, Kasiviswanathan 2019),
where a sum of updates clipped to C has sensitivity 2C: the Gaussian with std
z C is accounted with noise multiplier z / 2. The two epsilons answer different
neighbouring relations and are not comparable.
  fedjax-dp account shuffle --eps0 E0 --n N --delta D [--json]

(The command's parser is cli/parser.py's; `fedjax-dp account --config F` plans a run
config as the run is charged: experiment/plan_privacy.py.)
"""

from __future__ import annotations

import functools
import math

from fedjax_dp.privacy import accounting, amplification
from fedjax_dp.config import MIN_NOISE_MULTIPLIER, PLD_MIN_NOISE_MULTIPLIER  # noqa: F401
from fedjax_dp.errors import AccountError  # noqa: F401  (its old home)


def pld_epsilon(q: float, noise_multiplier: float, steps: int, delta: float) -> float:
  """Epsilon of `steps` Poisson-subsampled Gaussian steps by dp-accounting's PLD accountant.

  AccountError for a noise multiplier below PLD_MIN_NOISE_MULTIPLIER or when
  dp-accounting runs out of memory (the RDP figure then stands)."""
  return pld_epsilon_composed(q, [(noise_multiplier, steps)], delta)


def pld_epsilon_composed(q: float, events, delta: float) -> float:
  """Epsilon by dp-accounting's PLD of a sequence of Poisson-subsampled Gaussian
  steps, events [(noise multiplier, steps)] (runs of equal steps, each composed
  with a count: T single composes are 1000x slower)."""
  typed = tuple((type(z), z, int(steps)) for z, steps in events)   # float32 stays apart
  return _pld_epsilon_composed(q, typed, delta)


# A run's report, its resume's and a calibration's last check compose the same events:
# remembered per process (a pure function of its arguments and their types).
@functools.lru_cache(maxsize=256, typed=True)
def _pld_epsilon_composed(q, typed_events: tuple, delta) -> float:
  """As dp-accounting's PLDAccountant composes PoissonSampledDpEvent(q, Gaussian(z))
  `steps` times per event (its code path, step for step: the same floats), with each
  event's one-step PLD built once per process (_one_step_pld): a run's metrics row
  at every evaluation composes a longer prefix of the same events."""
  from dp_accounting.pld import privacy_loss_distribution as pld_lib
  events = [(z, steps) for _, z, steps in typed_events]
  for z, _ in events:
    if z < PLD_MIN_NOISE_MULTIPLIER:
      raise AccountError(f"noise multiplier {z:g}: the PLD accountant needs >= "
                         f"{PLD_MIN_NOISE_MULTIPLIER:g} (below it its discretisation needs "
                         "gigabytes); use the RDP accountant")
  try:
    composed = pld_lib.identity(
        value_discretization_interval=PLD_DISCRETISATION)
    for (kind, z, steps) in typed_events:
      if steps == 0 or q == 0:
        continue
      if q < 1:
        part = _one_step_pld(q, kind, z).self_compose(steps)
      else:   # a Gaussian composed `steps` times is one with std z / sqrt(steps)
        part = pld_lib.from_gaussian_mechanism(
            standard_deviation=z / math.sqrt(steps),
            value_discretization_interval=PLD_DISCRETISATION,
            neighboring_relation=_add_or_remove())
      composed = composed.compose(part)
    return float(composed.get_epsilon_for_delta(delta))
  except (MemoryError, OverflowError) as e:
    zs = ", ".join(f"{z:g}" for z, _ in events)
    raise AccountError(f"noise multiplier {zs}, {sum(n for _, n in events)} steps: the PLD "
                       f"accountant failed ({type(e).__name__}); use the RDP accountant")


PLD_DISCRETISATION = 1e-4   # dp-accounting's PLDAccountant default


def _add_or_remove():
  import dp_accounting
  return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@functools.lru_cache(maxsize=32, typed=True)
def _one_step_pld(q: float, kind: type, z: float):
  """One Poisson-subsampled Gaussian step's PLD, as PLDAccountant builds it."""
  from dp_accounting.pld import privacy_loss_distribution as pld_lib
  return pld_lib.from_gaussian_mechanism(
      standard_deviation=z, value_discretization_interval=PLD_DISCRETISATION,
      sampling_prob=q, neighboring_relation=_add_or_remove())


def _epsilon_or_inf(eps_of, z) -> float:
  """For calibration: a multiplier too small for PLD is too small for any target."""
  try:
    return eps_of(z)[0]
  except AccountError:
    return math.inf


def _require(name, value, ok, allowed):
  if value is None:
    raise AccountError(f"{name} is required")
  if not ok(value):
    raise AccountError(f"{name} = {value:g}: must be {allowed}")


def fixed_cohort_size(q: float, population) -> int:
  """m = q N for fixed-size sampling; it must be a whole number of records."""
  _require("--population", population, lambda v: v >= 1 and float(v).is_integer(),
           "an integer >= 1")
  m = q * population
  if abs(m - round(m)) > 1e-6 * max(1.0, m) or round(m) < 1:
    raise AccountError(f"--q {q:g} x --population {population:g} = {m:g}: fixed-size sampling "
                       "needs a whole cohort size m = q N >= 1")
  return int(round(m))


def account_dpsgd(q, noise_multiplier, steps, delta, accountant="rdp", target_epsilon=None,
                  sampling="poisson", population=None) -> dict:
  _require("--q", q, lambda v: 0 < v <= 1, "in (0, 1]")
  _require("--steps", steps, lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1")
  _require("--delta", delta, lambda v: 0 < v < 1, "in (0, 1)")
  if (noise_multiplier is None) == (target_epsilon is None):
    raise AccountError("give exactly one of --noise-multiplier and --target-epsilon")
  steps = int(steps)
  out = {"accountant": accountant, "sampling": sampling, "q": q, "steps": steps, "delta": delta}
  if sampling == "fixed":
    if accountant == "pld":
      raise AccountError("--accountant pld with --sampling fixed: dp-accounting's PLD has no "
                         "sampling-without-replacement event; use --accountant rdp")
    m = fixed_cohort_size(q, population)
    out.update(population=int(population), sample_size=m,
               neighbouring="replace one (sensitivity 2C: noise multiplier z accounted as z/2)")
  else:
    if population is not None:
      raise AccountError("--population is for --sampling fixed (Poisson sampling needs only --q)")
    out["neighbouring"] = "add/remove one (sensitivity C)"

  def eps_of(z):
    if sampling == "fixed":
      return accounting.fixed_size_epsilon(m, int(population), z / 2, steps, delta)
    if accountant == "pld":
      return pld_epsilon(q, z, steps, delta), None
    return accounting.dpsgd_epsilon(q, z, steps, delta)

  if target_epsilon is not None:
    _require("--target-epsilon", target_epsilon, lambda v: v > 0 and math.isfinite(v), "> 0")
    try:
      noise_multiplier = accounting.calibrate_noise_multiplier(
          target_epsilon, q, steps, delta, epsilon_fn=lambda z: _epsilon_or_inf(eps_of, z),
          tol=1e-4 if accountant == "rdp" else 1e-3)
    except ValueError as e:
      raise AccountError(str(e))
    out["target_epsilon"] = target_epsilon
  else:
    _require("--noise-multiplier", noise_multiplier,
             lambda v: v >= MIN_NOISE_MULTIPLIER and math.isfinite(v),
             f">= {MIN_NOISE_MULTIPLIER:g} (below it the RDP arithmetic overflows)")
  eps, order = eps_of(noise_multiplier)
  out.update(noise_multiplier=noise_multiplier, epsilon=eps)
  if order is not None:
    out["order"] = order
  return out


def account_shuffle(eps0, n, delta) -> dict:
  _require("--eps0", eps0, lambda v: v > 0 and math.isfinite(v), "> 0")
  _require("--n", n, lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1")
  _require("--delta", delta, lambda v: 0 < v < 1, "in (0, 1)")
  b = amplification.shuffle(eps0, int(n), delta)
  out = {"eps0": eps0, "n": int(n), **b.to_dict()}
  out["amplified"] = b.valid
  return out


def format_result(res: dict) -> str:
  if "eps0" in res:
    if res["valid"]:
      return (f"epsilon = {res['epsilon']:.6g} at delta = {res['delta']:g} "
              f"(shuffling {res['n']} reports of eps0 = {res['eps0']:g}; bound: {res['bound']})")
    return (f"epsilon = {res['epsilon']:.6g} (no amplification: {res['reason']})")
  how = (f"{res['accountant'].upper()}" + (f", optimal order {res['order']:g}" if "order" in res
                                          else ""))
  if res["sampling"] == "fixed":
    scheme = (f"fixed-size cohorts of {res['sample_size']} of {res['population']}, "
              "replace-one neighbours")
  else:
    scheme = f"Poisson sampling q = {res['q']:g}, add/remove-one neighbours"
  line = (f"epsilon = {res['epsilon']:.6g} at delta = {res['delta']:g} ({how}; {scheme}; "
          f"noise multiplier {res['noise_multiplier']:.6g}, {res['steps']} steps)")
  if "target_epsilon" in res:
    return f"noise_multiplier = {res['noise_multiplier']:.6g}\n{line}"
  return line
