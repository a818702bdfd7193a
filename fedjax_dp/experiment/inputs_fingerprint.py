"""inputs.json: what a run's own data, model and loss were, so that a resume or reuse can tell.

Names, sizes and SHA-256 digests of the data, of the model's parameter shapes
and traced initialisation, and of the loss's traced program.
"""

from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np

from fedjax_dp import losses
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.errors import RunError
from fedjax_dp.models import Model, num_params
from fedjax_dp.recipes.release_identity import loss_digest, loss_identity

INPUTS = "inputs.json"           # your own data, model or loss (fedjax_dp.run): what they were


def own_inputs(model: Model | None, data: Dataset | None, task: losses.Task,
               default: losses.Task = losses.CLASSIFICATION) -> dict | None:
  """What a run's own data, model and loss were (None: all the config's, the loss
  its dataset's `default` task): names, sizes and SHA-256 digests of the data and
  of the model's parameter shapes; a built-in task with arguments by its setting."""
  if model is None and data is None and loss_identity(task) == loss_identity(default):
    return None
  inputs = {"loss": {"name": task.name, "target_dtype": task.target_dtype,
                     "metrics": list(task.metrics), "sha256": loss_digest(task)}}
  if losses.is_builtin(task) and task.builtin:   # next_token's setting: its metrics too
    inputs["loss"]["builtin"] = task.builtin
  if data is not None:
    h = hashlib.sha256()
    for a in (data.x_train, data.y_train, data.x_test, data.y_test,
              *(data.client_parts or ())):
      a = np.ascontiguousarray(a)
      h.update(f"{a.dtype.str}{a.shape}".encode())
      h.update(a.tobytes())
    inputs["data"] = {"name": data.name, "source": data.source, "sha256": h.hexdigest(),
                      "train_examples": len(data.y_train), "test_examples": len(data.y_test)}
  if model is not None:
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    described = str(jax.tree.map(lambda a: (a.shape, str(a.dtype)), shapes))
    # the traced initialisation runs the module's forward pass once: its program tells a
    # relu from a tanh model of the same shapes (names and shapes alone did not)
    program = str(jax.make_jaxpr(model.init)(jax.random.PRNGKey(0)))
    inputs["model"] = {"name": model.name,
                       "params_sha256": hashlib.sha256(described.encode()).hexdigest(),
                       "program_sha256": hashlib.sha256(program.encode()).hexdigest(),
                       "params": num_params(shapes),
                       "with_features": model.apply_with_features is not None}
  return inputs


def check_inputs(out: str, inputs: dict | None) -> None:
  """RunError when a resume's own data, model or loss differ from the run's."""
  path = os.path.join(out, INPUTS)
  try:
    with open(path) as f:
      saved = json.load(f)
  except FileNotFoundError:
    saved = None
  except (OSError, ValueError) as e:
    raise RunError(f"--resume: {path} is unreadable ({e.__class__.__name__}): it says which "
                   "data, model and loss the run had") from None
  if saved == inputs:
    return
  if inputs is None:
    raise RunError(f"--resume: the run in {out} was made by fedjax_dp.run with your own "
                   f"{', '.join(k for k in ('data', 'model', 'loss') if k in saved)} "
                   f"({INPUTS}): resume it from Python with fedjax_dp.run(..., resume=True)")
  if saved is None:
    raise RunError(f"--resume: the run in {out} used the config's data, model and loss; "
                   "resume it without data=, model= or loss=")
  differ = [k for k in ("data", "model", "loss") if saved.get(k) != inputs.get(k)]
  raise RunError(f"--resume: the {' and '.join(differ)} differ from those of the run in {out} "
                 f"({INPUTS}): resume with the same ones, or start a new run")
