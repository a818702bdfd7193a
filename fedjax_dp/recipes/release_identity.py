"""A release's identity, and the run key that follows from it.

Every cohort, training and noise draw of a run comes from its run key. Two
releases computed from different settings or inputs must never share a draw:
two models released with the same noise N(0, I), one at noise multiplier 1 and
one at 2 (a sweep grid), or one at lr 0.1 and one at 0.2, give back the clipped
sum (or the difference of two clipped sums) by subtraction, and the pair has no
finite epsilon, whatever each one reports. Keeping the seed secret does not
help: the attack needs only the two released models.

So the run key is PRNGKey(seed) with a 64-bit digest of the release's identity
folded in:

  settings   every config key but those that change no draw and no released
             value (RELEASE_NEUTRAL_KEYS: how the run executes and how often it
             evaluates or saves);
  inputs     the training data as the store holds it (examples, targets, which
             client has which rows), your own model's and loss's traced
             programs, per-feature tiers and per-client budgets.

The same identity and seed give the same key, so a run reproduces bit for bit,
and two runs of the same identity and seed are one release (the same draws,
the same numbers). Anything else draws afresh: each sweep cell, a rerun on
updated data, another model. The model's initialisation stays PRNGKey(seed)'s
alone: it reads no data, so sweep cells of one seed start from one model.
"""

from __future__ import annotations

import hashlib
import os
import json

import jax
import numpy as np

from fedjax_dp import losses
from fedjax_dp.config import Config
from fedjax_dp.config.schema import data_seed
from fedjax_dp.privacy.mechanisms import get_mechanism

# Config keys that change no draw and no released value (beyond float summation
# order): where the data is read from (its contents are digested), checkpoints,
# devices, batching and where the per-client table is kept, and how often the
# model is evaluated (a run evaluated every round publishes a superset of the same
# models). The table's dtype and the matmul precision change numbers: they stay.
RELEASE_NEUTRAL_KEYS = ("data_dir", "checkpoint_every", "keep_checkpoints", "devices",
                        "client_parallelism", "client_batch", "eval_batch_size", "eval_every",
                        "client_state_store", "client_state_dir")


# Keys added after the digest's form was fixed, left out at their default so that
# every release made before them keeps its run key (its draws, its golden results)
LATER_KEYS = {"mf_bands": None, "min_separation": None, "server_lr_schedule": "constant",
              "server_lr_min": 0.0, "local_noise_draw": "client",
              "test_clients": 0,
              # Flower's partitioners' options (data/flwr_partitions.py)
              "min_partition_size": 10, "self_balancing": False, "client_sizes": None,
              "class_assignment": "random", "shards_per_client": 2, "shard_size": None,
              "keep_incomplete_shard": False}


def rounds_shape_the_rounds(cfg: Config) -> bool:
  """Whether a round's computation reads `rounds`: a learning-rate schedule over
  the run, a noise multiplier calibrated to reach target_epsilon in `rounds`, or a
  correlated-noise strategy built for `rounds` (its matrix and sensitivity)."""
  mechanism = get_mechanism(cfg.dp)
  return (cfg.lr_schedule != "constant" or cfg.server_lr_schedule != "constant"
          or (mechanism.private and cfg.noise_multiplier is None)
          or mechanism.strategy_for is not None)


def settings_digest(cfg: Config) -> str:
  """SHA-256 (hex) of cfg's release settings: every key but RELEASE_NEUTRAL_KEYS,
  data_seed resolved (null is the seed: a sweep pins it, and its cell is the same
  release as the run of its config), and `rounds` only where a round reads it
  (rounds_shape_the_rounds). Otherwise a run of more rounds is the shorter one's
  release extended: its first rounds compute and draw exactly the shorter run's,
  and its accountant covers every iterate, so publishing both reveals no more than
  the longer one, and `--resume --rounds` more gives the longer run bit for bit."""
  from fedjax_dp.recipes.flat import local_noise_draw
  # local_noise_draw as resolved: 'client' (each report's own draw, as every local DP
  # release made before the key) is left out, the draw for the sum enters
  settings = dict(cfg.to_dict(), local_noise_draw=local_noise_draw(cfg))
  settings = {k: v for k, v in settings.items() if k not in RELEASE_NEUTRAL_KEYS
              and not (k in LATER_KEYS and v == LATER_KEYS[k])}
  settings["data_seed"] = data_seed(cfg)
  del settings["plugins"]
  if cfg.plugins:   # the code of the stages they register, not where it lies
    settings["plugins"] = [plugin_digest(p) for p in cfg.plugins]
  if not rounds_shape_the_rounds(cfg):
    del settings["rounds"]
  return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def plugin_digest(plugin: str) -> str:
  """SHA-256 (hex) of a plugin's source: the bytes it was imported from in this
  process (the code that runs, though the file may have been edited since), else a
  .py file's bytes or an importable module's file (its name where it has none): a
  plugin edited under the same name is another release. A package's is its
  __init__.py's; modules a plugin imports are not covered."""
  import importlib.util
  from fedjax_dp.recipes.plugins import imported_digest
  imported = imported_digest(plugin)
  if imported is not None:
    return imported
  path = plugin if plugin.endswith(".py") else getattr(
      importlib.util.find_spec(plugin), "origin", None)
  if not path or not os.path.isfile(path):
    return hashlib.sha256(plugin.encode()).hexdigest()
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def program_digest(fn, *args) -> str:
  """SHA-256 (hex) of fn's traced program on args: two functions of one name and
  shapes that compute different things (a relu and a tanh model) differ."""
  return hashlib.sha256(str(jax.make_jaxpr(fn)(*args)).encode()).hexdigest()


def loss_identity(task: losses.Task) -> str:
  """A built-in task's name (stable across JAX versions), else loss_digest."""
  if any(task is t for t in losses.NAMES.values()):
    return f"built-in {task.name}"
  if losses.is_builtin(task):   # a built-in task made with arguments (losses.next_token)
    return f"built-in {task.builtin}"
  return loss_digest(task)


def loss_digest(task: losses.Task) -> str:
  """SHA-256 (hex) of the loss's traced program on small examples (two lambdas of
  one name differ), or of its code where it cannot be traced on them."""
  import jax.numpy as jnp
  y = jnp.zeros((2,), task.target_dtype)
  mask = jnp.ones((2,), bool)
  for outputs in (jnp.zeros((2, 3)), jnp.zeros((2, 1)), jnp.zeros((2,))):
    try:
      return program_digest(task.loss, outputs, y, mask)
    except Exception:   # shapes this loss does not take: try the next
      continue
  code = getattr(task.loss, "__code__", None)
  text = repr(task.loss) if code is None else repr((code.co_code, code.co_consts, code.co_names))
  return hashlib.sha256(text.encode()).hexdigest()


def inputs_digest(store, model=None, task: losses.Task | None = None, feature_tiers=None,
                  client_budgets=None) -> str:
  """SHA-256 (hex) of what a release is computed from besides its settings: the
  store's x [N, ...], y, client_index [C, max_n] and client_count [C]; `model`,
  your own (models.Model; a built-in one is named by its config keys); the loss
  (`task`, default classification: loss_identity); per-feature tiers [features];
  per-client budgets [num_clients]. One pass over the data (about 1.5 GB/s)."""
  h = hashlib.sha256()
  arrays = {"x": store.x, "y": store.y, "client_index": store.client_index,
            "client_count": store.client_count, "feature_tiers": feature_tiers,
            "client_budgets": client_budgets}
  for name, a in arrays.items():
    if a is not None:
      a = np.ascontiguousarray(np.asarray(a))
      h.update(f"{name} {a.dtype.str}{a.shape}".encode())
      h.update(memoryview(a).cast("B"))
  if model is not None:
    # both programs: a hand-built Model may share its init with another's apply
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    h.update(f"model {model.name}".encode())
    h.update(program_digest(model.init, jax.random.PRNGKey(0)).encode())
    h.update(program_digest(model.apply, params, jax.ShapeDtypeStruct(
        (1,) + tuple(store.x.shape[1:]), store.x.dtype)).encode())
  h.update(f"loss {loss_identity(task or losses.CLASSIFICATION)}".encode())
  return h.hexdigest()


def run_key(cfg: Config, inputs: str) -> jax.Array:
  """The run key (uint32[2]) of the release cfg computes from `inputs`
  (inputs_digest): PRNGKey(seed) with the identity's 64-bit digest folded in."""
  digest = hashlib.sha256(f"{settings_digest(cfg)} {inputs}".encode()).digest()
  words = np.frombuffer(digest[:8], np.uint32)
  key = jax.random.PRNGKey(cfg.seed)
  for w in words:
    key = jax.random.fold_in(key, int(w))
  return key
