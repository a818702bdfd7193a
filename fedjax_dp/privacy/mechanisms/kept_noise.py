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

# the config keys a kept-noise bundle reads (its settings)
KEYS = ("kept_noise_multiplier", "ldp_epsilon", "ldp_delta")


class KeptNoise(NamedTuple):
  """A calibration of the noise on the kept coordinates: the client half and the
  properties its report, releases and checks read. `settings` are {config key:
  value} of KEYS."""
  name: str
  stage: Callable              # (settings, clip, sparsity, draw) -> pipeline.ClientStage
  std: Callable                # (settings, clip, k, lr, n) -> float: the std of a client of
                               # n examples at learning rate lr (the report's figures)
  std_says: str = ""           # the std as the report writes it ('z C')
  follows_lr: bool = False     # its std scales with the round's learning rate
  reveals_size: bool = False   # its std depends on the client's example count n_i: the
                               # std is not covered, and its epsilon holds only for
                               # neighbours of the same size (the report's size_leak)
  papers_chain: bool = False   # reported with the paper's own (epsilon, delta) chain and
                               # the paper's one-step sensitivity, labelled as the paper's
  check: Callable | None = None  # (settings) -> why it cannot run them, one line, or None


# ------------------------------------------------------------------ the client halves


def noise_on_kept(std: float, draw: str = "client") -> pipeline.ClientStage:
  """gaussian_on_kept with a fixed std (z C), as data."""
  return pipeline.gaussian_on_kept(lambda ctx: ctx.hp["std"], draw, {"std": std})


def paper_std(epsilon: float, delta: float, clip: float, k: int) -> Callable:
  """TopkSDP-FL's calibration (after Wei et al. 2020), per client:
    sigma = Delta_s sqrt(2 ln(1.25 / delta)) / (epsilon / k),  Delta_s = 2 lr C / n_i.
  Labelled as the paper's: it covers one example in one SGD step, not a client's
  update after E epochs, and the classical Gaussian bound needs epsilon / k < 1."""
  factor = _paper_factor(epsilon, delta, k)

  def std(ctx):
    return 2.0 * ctx.lr * clip / jnp.maximum(ctx.num_examples, 1).astype(jnp.float32) * factor
  return std


def paper_noise_on_kept(epsilon: float, delta: float, clip: float, sparsity: float,
                        draw: str = "client") -> pipeline.ClientStage:
  """gaussian_on_kept with `paper_std` for k = keep_count(d, sparsity), k taken from
  the upload's size when the stage runs (so the stage is built without d)."""
  own = {"clip": clip}

  def update(u, s, ctx):
    k = pipeline.keep_count(u.values.shape[0], sparsity)
    std = paper_std(epsilon, delta, pipeline.numbers(ctx, own)["clip"], k)
    return pipeline.gaussian_on_kept(std, draw).update(u, s, ctx._replace(hp=()))
  return pipeline.gaussian_on_kept(lambda ctx: 0.0, draw, own)._replace(update=update)


def _paper_factor(epsilon: float, delta: float, k: int) -> float:
  return math.sqrt(2 * math.log(1.25 / delta)) * k / epsilon


# ------------------------------------------------------------------ the bundles


def _paper_check(settings: dict[str, Any]) -> str | None:
  if settings["ldp_epsilon"] is None:
    return ("config key 'kept_noise' = 'paper': needs ldp_epsilon (the per-round client "
            "budget of the paper's calibration)")
  return None


def paper() -> KeptNoise:
  """TopkSDP-FL's calibration to (ldp_epsilon, ldp_delta) per round."""
  def stage(s, clip, sparsity, draw):
    return paper_noise_on_kept(s["ldp_epsilon"], s["ldp_delta"], clip, sparsity, draw)

  def std(s, clip, k, lr, n):
    return 2 * lr * clip / n * _paper_factor(s["ldp_epsilon"], s["ldp_delta"], k)
  return KeptNoise("paper", stage, std, "2 lr C factor / n_i", follows_lr=True,
                   reveals_size=True, papers_chain=True, check=_paper_check)


def multiplier() -> KeptNoise:
  """std = kept_noise_multiplier x the clip the noise is calibrated to."""
  def stage(s, clip, sparsity, draw):
    return noise_on_kept(s["kept_noise_multiplier"] * (clip or 0.0), draw)

  def std(s, clip, k, lr, n):
    return s["kept_noise_multiplier"] * clip
  return KeptNoise("multiplier", stage, std, "z C")
