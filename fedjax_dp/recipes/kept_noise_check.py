"""A run's kept noise checked against what its report can account, once its client
sizes are known (privacy/mechanisms/kept_noise.problem): at the run's sizes and
their neighbours, the learning rates its rounds run at, and the number of
coordinates it keeps, each beside wide grids."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np

from fedjax_dp.compression.pipeline import keep_count
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp.recipes.flat import kept_noise_of, kept_noise_settings, noise_clip

_GRID_K = 32   # a kept count probed besides the run's


def check_kept_noise(cfg, sizes: Sequence[int] = (), model=None) -> None:
  """ConfigError (one line) where the report could not account the run's kept-noise
  std: a calibration whose std depends on the client's size or the learning rate
  other than it declares. `sizes`: the clients' example counts (none: the grid
  alone, as a sweep checks its cells before reading data); `model` (models.Model):
  its size gives the run's kept count k."""
  kept, clip = kept_noise_of(cfg), noise_clip(cfg)
  if kept is None or clip is None:   # (no clip: validate refuses it, naming the clips)
    return
  ks = {_GRID_K}
  if model is not None:
    d = _model_size(model)
    ks.add(keep_count(d, cfg.s_local) if cfg.s_local > 0 else d)
  settings = kept_noise_settings(cfg, kept)
  for k in sorted(ks):
    problem = kept_noise.problem(kept, settings, clip, sizes, schedule_lrs(cfg), k)
    if problem:
      raise ConfigError(problem)


def schedule_lrs(cfg, most: int = 256) -> np.ndarray:
  """The distinct learning rates the rounds run at (optax's cosine decay, as
  core/schedules.py), `most` of them spread over their range."""
  if cfg.lr_schedule == "constant":
    return np.asarray([cfg.lr], np.float64)
  alpha = cfg.lr_min / cfg.lr
  t = np.arange(cfg.rounds, dtype=np.float64)
  lrs = np.unique(cfg.lr * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * t / cfg.rounds)) + alpha))
  return lrs[np.linspace(0, len(lrs) - 1, min(len(lrs), most)).astype(int)]


def _model_size(model) -> int:
  """The number of the model's parameters, from their shapes (nothing computed)."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
