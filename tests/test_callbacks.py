"""The run loop as callbacks: your callbacks see what the defaults wrote, can stop the run,
and a run with your own data, model and loss keeps what they were (inputs.json)."""

import json
import os

import flax.linen as nn
import numpy as np
import pytest

from fedjax_dp.experiment import checkpoint

from fedjax_dp import losses
from fedjax_dp.callbacks import Callback
from fedjax_dp.cli import main
from fedjax_dp import make_config
from fedjax_dp.data import from_clients
from fedjax_dp.models import from_flax
from fedjax_dp.experiment.runner import run_experiment
from fedjax_dp.errors import RunError

FAST = dict(dataset="digits", num_clients=6, clients_per_round=3, hidden=[8], batch_size=32,
            lr=0.05, devices=1, eval_every=2, checkpoint_every=2)


def rows(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def digest(out, step):
  with open(os.path.join(out, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)[checkpoint.DIGEST_KEY]


@pytest.mark.parametrize("stop_at, evaluated, checkpointed", [
    # a checkpoint round: the run's end evaluates it (`make test-slow`: CI runs it)
    pytest.param(3, [2, 3], [3], marks=pytest.mark.slow),
    (4, [2, 4], [3, 4]),   # an evaluation round: the run's end checkpoints it
])
def test_a_callback_sees_each_chunk_and_a_stopped_run_ends_evaluated_and_checkpointed(
    tmp_path, stop_at, evaluated, checkpointed):
  seen = []

  def after(ctx, stats):
    seen.append((ctx.round, ctx.row["round"] if ctx.row else None, len(stats.loss_sum)))
    return ctx.round == stop_at

  ended = []
  cb = Callback(on_run_start=lambda ctx: seen.append(("start", ctx.start)),
                after_chunk=after, on_run_end=lambda ctx: ended.append(ctx.summary["rounds"]))
  out = str(tmp_path / "stopped")
  cfg = make_config(dict(FAST, rounds=6, checkpoint_every=3))   # chunks end at 2, 3, 4, 6
  summary = run_experiment(cfg, out, progress=False, callbacks=[cb])
  assert seen == [("start", 0), (2, 2, 2), (3, None, 1), (4, 4, 1)][:stop_at]
  assert ended == [stop_at] and summary["rounds"] == stop_at
  assert summary["final"]["round"] == stop_at == summary["final"]["bytes_up"] // (
      3 * 4 * summary["model"]["params"])
  assert [r["round"] for r in rows(out)] == evaluated
  assert checkpoint.steps(os.path.join(out, "checkpoints")) == checkpointed
  assert summary["privacy"]["dp"] == "none"
  # resumed, it runs on to `rounds` and reaches the state of a run never stopped
  again = run_experiment(cfg, out, progress=False, resume=True)
  straight = str(tmp_path / "straight")
  run_experiment(cfg, straight, progress=False)
  assert again["rounds"] == 6 and digest(out, 6) == digest(straight, 6)
  assert rows(out)[-1]["test_accuracy"] == rows(straight)[-1]["test_accuracy"]


def test_a_user_stop_under_central_dp_is_not_reported_as_a_budget_stop(tmp_path):
  cb = Callback(after_chunk=lambda ctx, stats: ctx.round >= 2)
  summary = run_experiment(make_config(dict(FAST, rounds=6, dp="central", noise_multiplier=1.0,
                                            target_epsilon=50.0, delta=1e-3)),
                           str(tmp_path / "r"), progress=False, callbacks=[cb])
  assert summary["rounds"] == 2 and summary["privacy"]["stopped_by_budget"] is False
  assert summary["privacy"]["rounds_accounted"] == 2


class Line(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(x.reshape((x.shape[0], -1)))


def own(seed=0, n_clients=4):
  rng = np.random.default_rng(seed)
  clients = [(x, (x @ np.ones(3) + 0.5).astype(np.float32))
             for x in (rng.normal(size=(8, 3)).astype(np.float32) for _ in range(n_clients))]
  ds = from_clients(clients, test=clients[0], name="lines")
  cfg = make_config(dict(dataset="custom", model="custom", num_clients=n_clients,
                         clients_per_round=2, batch_size=4, lr=0.05, rounds=4, eval_every=2,
                         checkpoint_every=2, devices=1))
  return cfg, ds, from_flax(Line(), clients[0][0][:1], name="line")


def test_own_inputs_are_written_and_a_resume_with_others_is_refused(tmp_path, capsys):
  cfg, ds, model = own()
  out = str(tmp_path / "own")
  summary = run_experiment(cfg, out, progress=False, model=model, data=ds,
                           task=losses.REGRESSION_MSE)
  r = rows(out)
  assert list(r[0])[:4] == ["round", "test_mse", "test_mae", "test_loss"]
  assert r[-1]["test_loss"] == r[-1]["test_mse"] and summary["final"] == r[-1]
  assert summary["inputs"]["data"]["name"] == "lines" and summary["data"]["name"] == "lines"
  assert summary["model"]["name"] == "line" and "best_test_accuracy" not in summary
  for png in ("mse.png", "mae.png", "loss.png"):
    assert os.path.getsize(os.path.join(out, png)) > 1000
  assert not os.path.exists(os.path.join(out, "accuracy.png"))
  with open(os.path.join(out, "inputs.json")) as f:
    loss = json.load(f)["loss"]
  assert len(loss.pop("sha256")) == 64
  assert loss == {"name": "regression", "target_dtype": "float32",
                  "metrics": ["mse", "mae", "loss"]}
  longer = make_config(dict(cfg.to_dict(), rounds=6))
  _, other, _ = own(seed=1)
  with pytest.raises(RunError, match=r"--resume: the data differ from those of the run in"):
    run_experiment(longer, out, resume=True, progress=False, model=model, data=other,
                   task=losses.REGRESSION_MSE)
  with pytest.raises(RunError, match=r"--resume: the loss differ"):
    run_experiment(longer, out, resume=True, progress=False, model=model, data=ds,
                   task=losses.REGRESSION_MAE)
  before = open(os.path.join(out, "metrics.jsonl")).read()
  capsys.readouterr()   # the runs above said their headers
  assert main(["run", "--no-progress", "--resume", "--out", out]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --resume: the run in") and "fedjax_dp.run(..., resume=True)" in err
  assert open(os.path.join(out, "metrics.jsonl")).read() == before
  again = run_experiment(longer, out, resume=True, progress=False, model=model, data=ds,
                         task=losses.REGRESSION_MSE)
  assert again["rounds"] == 6 and [x["round"] for x in rows(out)] == [2, 4, 6]


def test_a_callback_that_is_not_one_is_refused_before_anything_is_written(tmp_path):
  from fedjax_dp.errors import ConfigError
  out = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"^callbacks\[1\] is a function: allowed are "):
    run_experiment(make_config({"rounds": 1}), str(out),
                   callbacks=[Callback(), lambda ctx: None], progress=False)
  assert not out.exists()
