"""TopkSDP-FL's noise on the kept coordinates (the config's `kept_noise`), one bundle per
calibration.

Each client adds N(0, std^2) to the coordinates its top-k stage sends: the client
half is compression/pipeline.gaussian_on_kept, drawn by the client from its key
or, where the aggregate is a plain weighted sum, by the server in one draw of
the same distribution. It sits on the client (a local guarantee against the
server), beside or without a `dp` mechanism. Two calibrations:

  paper       TopkSDP-FL's, after Wei et al. 2020: std = 2 lr C sqrt(2 ln(1.25 / delta))
              k / (epsilon n_i). Its std follows the round's learning rate and the
              client's size n_i (which it reveals); its sensitivity covers one example
              in one SGD step. The paper's (epsilon, delta) chain is reported labelled.
  multiplier  std = z C, fixed: each upload is a Gaussian mechanism of the clip.

The report (experiment/reports/topksdp_privacy.py), the release registry, the
attacks and the checks read a bundle's properties, never its name: the config's
value is read once, by recipes/flat.kept_noise_of.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp

from fedjax_dp.compression import pipeline
from fedjax_dp.config.keys import KEYS
from fedjax_dp.stage import NOT_COVERED, PUBLIC

class KeptNoise(NamedTuple):
  """A calibration of the noise on the kept coordinates: its std, one function the
  round (traced) and the report (numpy floats) both evaluate, so the report quotes
  the noise the rounds draw; and the properties its report, releases and checks
  read. `settings` are {config key: value} of the keys it `reads`; `numbers` are
  the std's numbers the round passes as data (a sweep changes them without
  recompiling)."""
  name: str
  numbers: Callable            # (settings, clip) -> {name: float}
  std: Callable                # (numbers, settings, k, lr, n) -> the std of a client of n
                               # examples at learning rate lr, k of the upload's coordinates
                               # kept (plain arithmetic: numpy floats or traced arrays)
  std_says: str = ""           # the std as the report writes it ('z C')
  follows_lr: bool = False     # its std scales with the round's learning rate
  reveals_size: bool = False   # its std depends on the client's example count n_i: the
                               # std is not covered, and its epsilon holds only for
                               # neighbours of the same size (the report's size_leak)
  papers_chain: bool = False   # reported with the paper's own (epsilon, delta) chain and
                               # the paper's one-step sensitivity, labelled as the paper's
                               # (it reads ldp_epsilon, the chain's per-round budget)
  check: Callable | None = None  # (settings) -> why it cannot run them, one line, or None
  reads: tuple = ("ldp_delta",)  # the config keys of its settings, of SETTINGS (ldp_delta:
                                 # the delta of its guarantee); another set away from its
                                 # default is refused as read by nothing
  releases: tuple = ()         # ((summary.json path, status, says), ...) its report adds,
                               # looked up before the section's own (`releases` below)


# the config keys of the kept-noise stage (config/keys.py rows that feed
# upload:gaussian_on_kept): its switch and who draws; the settings a calibration may
# read; and those of them a sweep changes as data (data=True): `numbers` reads those,
# `std` never sees them, so that the round (which receives the numbers as data) and
# the report cannot disagree
STAGE_KEYS = ("kept_noise", "kept_noise_draw")
SETTINGS = tuple(k.name for k in KEYS
                 if "upload:gaussian_on_kept" in k.feeds and k.name not in STAGE_KEYS)
DATA_SETTINGS = tuple(k.name for k in KEYS if k.name in SETTINGS and k.data)


def _fixed(settings: dict[str, Any]) -> dict[str, Any]:
  """The settings std sees: those a sweep cannot change under a compiled round."""
  return {k: v for k, v in settings.items() if k not in DATA_SETTINGS}


def check_bundle(kept: KeptNoise) -> str | None:
  """Why `kept` cannot be registered (its reads), or None."""
  unknown = [k for k in kept.reads if k not in SETTINGS]
  if unknown:
    return (f"register_kept_noise: {kept.name!r} reads {', '.join(map(repr, unknown))}; a "
            f"calibration reads of {', '.join(SETTINGS)}")
  if kept.papers_chain and not {"ldp_epsilon", "ldp_delta"} <= set(kept.reads):
    return (f"register_kept_noise: {kept.name!r} has papers_chain, whose chain reads "
            "ldp_epsilon and ldp_delta: add them to reads")
  return None


def client_stage(kept: KeptNoise, settings: dict[str, Any], clip: float | None,
                 sparsity: float, draw: str = "client") -> pipeline.ClientStage:
  """The client half: pipeline.gaussian_on_kept at `kept.std` for this client's
  n_i and the round's lr, k = keep_count(d, sparsity) taken from the upload's size
  when the stage runs (so the stage is built without d)."""
  own = kept.numbers(settings, clip or 0.0)

  def update(u, s, ctx):
    k = pipeline.keep_count(u.values.shape[0], sparsity)
    n = jnp.maximum(ctx.num_examples, 1).astype(jnp.float32)
    std = kept.std(pipeline.numbers(ctx, own), _fixed(settings), k, ctx.lr, n)
    return pipeline.gaussian_on_kept(lambda c: std, draw).update(u, s, ctx._replace(hp=()))
  return pipeline.gaussian_on_kept(lambda ctx: 0.0, draw, own)._replace(update=update)


def report_std(kept: KeptNoise, settings: dict[str, Any], clip: float, k: int, lr: float,
               n: int) -> float:
  """The std of a client of n examples at learning rate lr, as the report quotes it
  (a float, whatever arithmetic std uses)."""
  return float(kept.std(kept.numbers(settings, clip), _fixed(settings), k, lr, n))


def releases(kept: KeptNoise | None) -> tuple[tuple[str, str, str], ...]:
  """What the report's kept-noise section (summary.json privacy.kept_noise) publishes,
  each path with its status under `kept` (None: no kept noise, declared as the most
  revealing calibration would be): the calibration's own rows first."""
  size = NOT_COVERED if kept is None or kept.reveals_size else PUBLIC
  return (*(kept.releases if kept is not None else ()),
          ("privacy.kept_noise.noise_std.*_over_clients", size,
           "the kept noise's std, smallest and largest over the clients (where it follows the "
           "client's size, 2 lr C / n_i under 'paper', it gives the largest and smallest "
           "client's example count)"),
          ("privacy.kept_noise.size_leak.**", NOT_COVERED,
           "what a std that follows the client's size reveals of it, quoting sizes in the data"),
          ("privacy.kept_noise.not_accounted", size,
           "the kept noise's caveats (where its std follows the client's size, quoting sizes "
           "in the data)"),
          ("privacy.kept_noise.accountant.noise_multiplier", size,
           "the least-noised round's multiplier (where the std follows the client's size, "
           "from the largest client's)"),
          ("privacy.kept_noise.**", PUBLIC, "the kept noise's set-up and accountant"))


# ------------------------------------------------------------------ the bundles


def _paper_factor(epsilon: float, delta: float, k: int) -> float:
  return math.sqrt(2 * math.log(1.25 / delta)) * k / epsilon


def _paper_std(hp, s, k, lr, n):
  """TopkSDP-FL's calibration (after Wei et al. 2020), per client:
    sigma = Delta_s sqrt(2 ln(1.25 / delta)) / (epsilon / k),  Delta_s = 2 lr C / n_i.
  Labelled as the paper's: it covers one example in one SGD step, not a client's
  update after E epochs, and the classical Gaussian bound needs epsilon / k < 1."""
  return 2 * lr * hp["clip"] / n * _paper_factor(s["ldp_epsilon"], s["ldp_delta"], k)


def paper() -> KeptNoise:
  """TopkSDP-FL's calibration to (ldp_epsilon, ldp_delta) per round."""
  return KeptNoise("paper", lambda s, clip: {"clip": clip}, _paper_std, "2 lr C factor / n_i",
                   follows_lr=True, reveals_size=True, papers_chain=True,
                   reads=("ldp_epsilon", "ldp_delta"))


def multiplier() -> KeptNoise:
  """std = kept_noise_multiplier x the clip the noise is calibrated to."""
  return KeptNoise("multiplier", lambda s, clip: {"std": s["kept_noise_multiplier"] * clip},
                   lambda hp, s, k, lr, n: hp["std"], "z C",
                   reads=("kept_noise_multiplier", "ldp_delta"))


# ------------------------------------------------------------------ what the report assumes

_GRID_SIZES = tuple(int(round(10 ** (e / 4))) for e in range(25))   # 1 .. 10^6
_GRID_LRS = tuple(10.0 ** (e / 2) for e in range(-12, 3))          # 1e-6 .. 10


def problem(kept: KeptNoise, settings: dict[str, Any], clip: float, sizes, lrs,
            k: int = 32) -> str | None:
  """Why the report could not account `kept` in this run, in one line, or None.

  The report takes a std that depends on the client's size n as proportional to
  1 / n (size_leak; reveals_size), one that depends on the learning rate as
  proportional to it (follows_lr), and quotes the least-noised client's epsilon.
  Probed where it matters: the run's client sizes `sizes` with each one's
  neighbours n - 1 and n + 1 (a neighbouring dataset's), the learning rates `lrs`
  its rounds run at, and its kept count k, each beside a log grid (n up to 10^6,
  lr 1e-6 to 10)."""
  sizes = sorted({int(m) for n in sizes for m in (n - 1, n, n + 1) if m >= 1} | set(_GRID_SIZES))
  lrs = sorted({float(x) for x in lrs if x > 0} | set(_GRID_LRS))
  probe_sizes = sorted({sizes[0], sizes[-1], *_GRID_SIZES[::4]})

  def std(n, lr):
    return float(report_std(kept, settings, clip, k, lr, float(n)))
  base = lrs[len(lrs) // 2]
  try:
    return (_dependence(kept, "n", [std(n, base) for n in sizes], sizes)
            or next((p for n in probe_sizes
                     if (p := _dependence(kept, "lr", [std(n, lr) for lr in lrs], lrs))), None)
            or next((p for lr in lrs
                     if (p := _dependence(kept, "n", [std(n, lr) for n in probe_sizes],
                                          probe_sizes))), None))
  except KeyError as e:   # a setting std may not see (DATA_SETTINGS), or one not in reads
    return (f"kept_noise {kept.name!r}: its std reads setting {e}, which it is not given "
            f"(it sees those of reads {kept.reads} but {', '.join(DATA_SETTINGS)}; a number a "
            "sweep changes reaches std through numbers())")


def _dependence(kept: KeptNoise, on: str, values: list[float], at: list[float]) -> str | None:
  """A dependence of the std `values` on n or lr (at `at`) that the report cannot
  account: undeclared, or not the declared proportion (1 / n, lr)."""
  if all(math.isclose(v, values[0], rel_tol=1e-6, abs_tol=1e-300) for v in values):
    return None
  declared, like = ((kept.reveals_size, [1.0 / x for x in at]) if on == "n" else
                    (kept.follows_lr, list(at)))
  what = "the client's size n_i" if on == "n" else "the learning rate"
  if not declared:
    return (f"kept_noise {kept.name!r}: its std depends on {what}; declare "
            f"{'reveals_size' if on == 'n' else 'follows_lr'}=True")
  ratio = [v / w for v, w in zip(values, like)]
  if not all(math.isclose(r, ratio[0], rel_tol=1e-6) for r in ratio):
    return (f"kept_noise {kept.name!r}: its std depends on {what} other than "
            f"{'as 1 / n_i' if on == 'n' else 'in proportion to it'}, which the report "
            "cannot account")
  return None
