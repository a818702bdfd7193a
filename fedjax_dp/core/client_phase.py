"""The client phase of a round: every cohort client's work, then the aggregate.

Runs inside shard_map over the mesh axis "clients", each device on its slice of
the cohort, in the stages' order:

  local training on the objective (its local terms)    ClientStages.train_one
  the terms' after-training step (upload, state)       objective.finish
  the upload pipeline (clips, top-k, kept noise)       ClientStages.pipeline
  the upload stages, one chain ordered by the trust    core/upload_stages.py
  boundary: canaries, attacks, the mechanism's client
  half (clip, local noise), the server's norm bound,
  the shuffler's weights
  the aggregate: a robust rule over the gathered       ClientStages.aggregator
  uploads, or the weighted sum over the devices

The mechanism's clip sits at its trust boundary (privacy/boundary.py): central
DP's trusted server clips every upload it receives, a malicious client's
replacement included; under local DP each client clips and noises its report
before it leaves, and a malicious client's replacement acts on that report.

How the clients run (map or vmap, state layout, the fused sum) is the
executor's (placement/executor.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp import algorithms
from fedjax_dp import stage as stage_lib
from fedjax_dp.compression import pipeline as pipeline_lib
from fedjax_dp.core import low_rank_steps, one_step, one_step_clipped, upload_stages
from fedjax_dp.core.schedules import round_learning_rate
from fedjax_dp.core.state import (CLIENT_TRAINING, KEPT_NOISE, PIPELINE, REPORT_NOISE_SUM,
                                  RoundStats)
from fedjax_dp.kernels import gaussian_noise, weighted_mean
from fedjax_dp.models import Model
from fedjax_dp.placement.executor import Executor, gather_over_devices, sum_over_devices
from fedjax_dp.privacy.dp_round import DPRound


class ClientStages(NamedTuple):
  """The static parts of the client phase, resolved once by build_simulation."""
  train_one: Callable             # training/client.local_train, bound to the model
  objective: algorithms.Objective  # the loss and the local terms
  model: Model
  pipeline: pipeline_lib.ClientStage | None   # upload stages (None: none configured)
  dp: DPRound                     # the mechanism; its client half where dp.client
  uploads: tuple                  # the stages between training and the aggregate, in
                                  # order (core/upload_stages.chain): canaries, attacks,
                                  # the mechanism's, the server's norm bound, shuffling
  poisoned_rows: Callable | None  # (rows, ids, round_key) -> rows: a data attack drawn each round
  aggregator: Callable | None     # a robust rule's aggregate (None: the weighted mean)
  rule_takes_ids: bool            # the rule is also given the uploads' client ids
  rule_figures: tuple             # the rule's metrics kept in RoundStats.metrics["aggregator"]
                                  # (flagged, clusters and those it declares)
  aggregate_noise: bool           # the pipeline owes kept noise, drawn once for the sum
  guard_nonfinite: bool           # NaN / inf coordinates enter the pipeline as zero
  executor: Executor
  summed_reports: bool = False    # local DP's reports' noise drawn once for their sum
                                  # (nothing reads a single report; same distribution)
  tap_dense: bool = False         # one step under DP: dense layers' norms from their
                                  # taps (core/layer_taps.py; the built-in models)


def client_phase(stages: ClientStages, params, cohort_ids, cohort_mask, client_hp, round_key,
                 clip_norm, noise_scales, client_noise_factor, client_state, server_state, x,
                 y, client_index, client_count):
  """Runs on each device over its slice of the cohort; returns psum'd totals.

  cohort_ids, cohort_mask: [local_cohort]; client_state: every client's state,
  leaves [num_clients, ...], replicated (one device): each client reads its own row where it
  trains (a gather of the cohort's rows beforehand would copy them all once
  more) and its new row is written back batch by batch (map_clients_with_state).
  With a resident executor, client_state is instead this device's rows in the
  resident layout, [local_cohort, ...], row i that of slot i, and comes back the
  same way; with a sharded table (executor.table_rows) this device's block of
  ids, [table_rows, ...] (placement/executor.py).
  guard_nonfinite: an upload's NaN or inf coordinates enter the client pipeline
  (its clips, noise and residual) as zero; under DP, clip_update sends an update
  whose norm is not finite as zero. Both are counted.
  client_hp: this round's client hyperparameters (hparams.py): lr, update_noise
  (local DP), momentum (where the client optimizer has momentum).
  Returns (aggregate, stats, client state, the psum of the objective's server
  contributions, server-state slots), all but a resident client state identical
  on all devices.
  noise_scales [parts]: this round's local noise std per part, over
  noise_multiplier * clip_norm; client_noise_factor [num_clients]: each
  client's own multiplier on top (the rule's client_noise: per-cluster noise, else
  ones). The server-state slots are {"aggregator": its new state} for a stateful
  robust aggregator (which reads server_state["aggregator"]), else {}.
    dp none: the example-weighted mean delta (FedAvg).
    dp central: the plain sum of the deltas, each clipped to `clip_norm` (the
      server noises the sum; weights by example count would give one client
      unbounded influence).
    dp local: the mean over participants of the deltas, each clipped and
      noised by its client with N(0, (z clip_norm)^2) from the client's own key.
    aggregator other than mean: the rule applied to the cohort's uploads,
      all-gathered over the device axis (see fedjax_dp/robust/).
  """
  counts = jnp.where(cohort_mask, client_count[cohort_ids], 0)
  dp_client = None
  if stages.summed_reports:   # the clip alone: the reports' noise is drawn for their sum
    dp_client = lambda u, cid: stages.dp.clip(u, clip_norm)
  elif stages.dp.client is not None:  # (upload, id) -> (clipped [and noised] upload, its norm)
    dp_client = lambda u, cid: stages.dp.client(u, cid, round_key, clip_norm, client_hp,
                                                noise_scales, client_noise_factor[cid])
  (res, contribs, owed, nonfinite, dp_norms, client_metrics), sums, client_state = _train_cohort(
      stages, params, cohort_ids, cohort_mask, counts, client_hp, round_key, client_state,
      server_state, x, y, client_index, client_count.shape[0], dp_client,
      clip_norm, client_noise_factor)
  contrib_sum = sum_over_devices(jax.tree.map(lambda c: jnp.sum(c, axis=0), contribs))
  u = upload_stages.Uploads(res.delta, cohort_mask, counts, counts.astype(jnp.float32),
                            nonfinite)
  ctx = upload_stages.UploadContext(cohort_ids, round_key, clip_norm, client_hp, dp_client,
                                    sums is not None, dp_norms)
  u, upload_metrics = upload_stages.run_chain(stages.uploads, u, ctx)
  # the stages' counts over this device's slice: the pipeline's per client, summed
  # over those who trained, and the upload stages'
  partial = stage_lib.merge_metrics(jax.tree.map(
      lambda m: jnp.sum(jnp.where(cohort_mask, m, jnp.zeros_like(m)), axis=0), client_metrics),
      upload_metrics)
  mask_f = u.mask.astype(jnp.float32)
  rule_metrics, server_slots = {}, {}
  if stages.aggregator is not None:
    mean_delta, rule_metrics, server_slots = _robust_aggregate(
        u.deltas, cohort_ids, u.mask, u.weights * mask_f, server_state,
        client_hp["aggregator"], stages.aggregator, stages.rule_takes_ids)
  else:
    report_std = (stages.dp.report_noise(params, clip_norm, client_hp, noise_scales)
                  if stages.summed_reports else None)
    mean_delta = _linear_aggregate(u.deltas, u.weights, mask_f, u.counts, sums, owed, round_key,
                                   report_std=report_std,
                                   divides_by=stages.dp.mechanism.divides_by,
                                   uniform=upload_stages.uniform_weights(stages.uploads),
                                   aggregate_noise=stages.aggregate_noise)
  stats = _round_stats(res, u.mask, u.nonfinite, partial, stage_lib.check_metrics(
      "aggregator", {k: rule_metrics[k] for k in stages.rule_figures if k in rule_metrics}),
                       client_hp["lr"])
  return mean_delta, stats, client_state, contrib_sum, server_slots


def _train_cohort(stages: ClientStages, params, cohort_ids, cohort_mask, counts, client_hp,
                  round_key, client_state, server_state, x, y, client_index, num_clients: int,
                  dp_client: Callable | None, clip_norm, client_noise_factor):
  """Every slot's client step through the executor -> ((results, contributions,
  owed noise, non-finite flags, DP norms) stacked [local, ...], the in-loop sums
  or None, client state). dp_client: the DP mechanism's client half, run inside
  the loop where the sum is fused (its norms, else ()); under one_step, its clip
  is taken from the clients' gradient norms (core/one_step_clipped.py)."""
  # Replicated params enter as device-invariant values; per-client gradients
  # must see them as varying, or grad sums them over devices (JAX_NOTES.md).
  params = jax.lax.pcast(params, "clients", to="varying")
  client_key = jax.random.fold_in(round_key, CLIENT_TRAINING)
  cohort_rows = client_index[cohort_ids]
  if stages.poisoned_rows is not None:
    cohort_rows = stages.poisoned_rows(cohort_rows, cohort_ids, round_key)
  keys = jax.vmap(lambda c: jax.random.fold_in(client_key, c))(cohort_ids)
  # The (example- or uniformly-) weighted sum of the uploads is taken inside
  # the client loop, after DP's client half where there is one: stacking
  # [local, d] uploads cost a zeroed buffer, a write and a read of it per round,
  # and memory that grows with the cohort (30,000 local-DP clients of the FMNIST
  # MLP: 16 GB). Attacks, robust rules, server clipping and audit canaries need
  # the uploads one by one and stack them.
  fused = stages.executor.fused_sum
  if stages.executor.parallelism == "low_rank":
    return (*_train_cohort_low_rank(stages, params, cohort_rows, counts, keys, cohort_mask,
                                    client_hp, server_state, x, y, dp_client, clip_norm,
                                    client_noise_factor[cohort_ids]), client_state)
  if stages.executor.parallelism == "one_step":
    loss_fn = _plain_loss(stages, params, server_state, client_hp)
    rows = cohort_rows[:, :stages.executor.width]
    if dp_client is None:
      res, delta_sum = one_step.train_cohort_one_step(loss_fn, params, rows, counts,
                                                      client_hp["lr"], x, y,
                                                      stages.executor.batch)
      return (*_cohort_outputs(stages, res, delta_sum, (), ()), client_state)
    res, delta_sum, norms, report_var = one_step_clipped.train_cohort_clipped(
        loss_fn, params, rows, counts, cohort_mask, client_noise_factor[cohort_ids],
        client_hp["lr"], x, y, stages.executor.batch, clip_norm=clip_norm,
        layout=stages.dp.layout, uniform=upload_stages.uniform_weights(stages.uploads),
        tap_dense=stages.tap_dense)
    return (*_cohort_outputs(stages, res, delta_sum, norms, report_var), client_state)
  one = _client_step(stages, params, client_hp, server_state, x, y,
                     jax.random.fold_in(round_key, PIPELINE), dp_client if fused else None,
                     client_noise_factor)
  args = (cohort_rows, counts, keys, cohort_mask, cohort_ids)
  sums = None
  if fused:
    sums = {"delta": jax.tree.map(jnp.zeros_like, params)}
    if stages.aggregate_noise:
      sums["noise_var"] = jnp.zeros_like(ravel_pytree(params)[0])   # [d], varying like params
    if stages.summed_reports:
      sums["report_var"] = jax.lax.pcast(jnp.zeros((), jnp.float32), "clients", to="varying")
  out, client_state = stages.executor.map_clients(one, args, client_state, cohort_ids,
                                                  cohort_mask, num_clients, sums)
  return (out[0], out[1], client_state) if fused else (out, None, client_state)


def _train_cohort_low_rank(stages: ClientStages, params, rows, counts, keys, took_part, client_hp,
                           server_state, x, y, dp_client, clip_norm, factor):
  """_train_cohort's outputs where the executor runs the cohort's steps as low-rank
  updates (core/low_rank_steps.py): the example-weighted sum, or under DP the
  clipped sum with each slot's norm."""
  loss_fn = _plain_loss(stages, params, server_state, client_hp)
  clipped = dp_client is not None
  res, delta_sum, norms, report_var = low_rank_steps.train_cohort_steps(
      loss_fn, params, rows, counts, keys, took_part, factor, client_hp["lr"],
      client_hp.get("momentum"), x, y, stages.executor.batch,
      epochs=stages.train_one.keywords["epochs"],
      batch_size=stages.train_one.keywords["batch_size"],
      uniform=upload_stages.uniform_weights(stages.uploads),
      clip_norm=clip_norm if clipped else None, layout=stages.dp.layout if clipped else None)
  return _cohort_outputs(stages, res, delta_sum, norms, report_var)


def _plain_loss(stages: ClientStages, params, server_state, client_hp):
  """The objective's loss at the global model (no local terms, no client state): a
  cohort path's (one_step, low_rank) per-client loss."""
  ctx = algorithms.LocalContext(params, {}, server_state)
  return stages.objective.make_loss(stages.model.apply, stages.model.apply_with_features, ctx,
                                    hp=client_hp["terms"])


def _cohort_outputs(stages: ClientStages, res, delta_sum, norms, report_var):
  """_train_cohort's outputs but the client state for a cohort path's results:
  ((results, no contributions, no owed noise, no non-finite flags, DP norms or (),
  no pipeline metrics), the sums: the deltas', and the reports' noise variance
  factor where it is drawn for their sum)."""
  no_flags = jnp.zeros(res.examples.shape, bool)
  sums = {"delta": delta_sum, **({"report_var": report_var} if stages.summed_reports else {})}
  return (res, {}, (), no_flags, norms, {}), sums


def _round_stats(res, cohort_mask, nonfinite, partial: dict, replicated: dict,
                 lr) -> RoundStats:
  """The round's statistics, summed over the devices: `partial`, the stages' counts
  over this device's slice ({stage: {name: scalar}}); `replicated`, the rule's, the
  same on every device."""
  mask_f = cohort_mask.astype(jnp.float32)
  # the integer counts in one all-reduce: a separate psum for the non-finite count
  # alone cost TopkSDP-FL's round 4-5 % on 2 CPU devices (BENCHMARKS.md, issue 18)
  leaves, tree = jax.tree.flatten(partial)
  ints = [i for i, v in enumerate(leaves) if v.dtype == jnp.int32]
  summed = sum_over_devices(jnp.stack([jnp.sum(cohort_mask, dtype=jnp.int32),
                                       jnp.sum(nonfinite, dtype=jnp.int32)]
                                      + [leaves[i] for i in ints]))
  rest = [i for i in range(len(leaves)) if i not in ints]
  others = sum_over_devices([leaves[i] for i in rest]) if rest else []
  for i, v in zip(ints + rest, list(summed[2:]) + list(others)):
    leaves[i] = v
  return RoundStats(loss_sum=sum_over_devices(jnp.sum(res.loss_sum * mask_f)),
                    examples=sum_over_devices(jnp.sum(res.examples * mask_f)),
                    participants=summed[0], spent=jnp.zeros((), jnp.int32),
                    event=jnp.zeros((), jnp.int32), lr=lr, nonfinite=summed[1],
                    metrics=stage_lib.merge_metrics(jax.tree.unflatten(tree, leaves),
                                                    {"aggregator": replicated} if replicated
                                                    else {}))


def _client_step(stages: "ClientStages", params, client_hp, server_state, x, y,
                 pipeline_key, dp_client: Callable | None, client_noise_factor) -> Callable:
  """One client's work, (args, state row) -> (outputs, new row): local training on
  the objective with its local terms, the terms' after-training step, the
  client pipeline (clips, top-k, kept noise), then DP's client half where
  `dp_client` (the fused sum's; with summed reports its clip, the report's noise
  variance factor (w_i f_i)^2 summed for one draw). `summed`: the upload is returned weighted for
  the in-loop sum (FedAvg: n_i; shuffled tuples and DP: uniform) instead of
  stacked, where the executor fuses the sum."""
  lr = client_hp["lr"]
  objective, client_pipeline = stages.objective, stages.pipeline
  keep_rows, summed = stages.executor.keep_rows, stages.executor.fused_sum

  def one(args, cstate):
    row, count, key, took_part, cid = args
    start = cstate["model"] if objective.solo else params
    ctx = algorithms.LocalContext(start, cstate, server_state)
    loss_fn = objective.make_loss(stages.model.apply, stages.model.apply_with_features, ctx,
                                  hp=client_hp["terms"])
    res = stages.train_one(start, row, count, key, lr, x=x, y=y, loss_fn=loss_fn,
                    momentum=client_hp.get("momentum"))
    upload, cstate, contrib = objective.finish(ctx, res.delta, res.params, res.steps, lr,
                                               took_part, keep_rows, hp=client_hp["terms"])
    bad = jnp.zeros((), bool)
    owed, pipeline_metrics = (), {}
    if client_pipeline is not None:
      if stages.guard_nonfinite:
        # a NaN or inf would reach the noise, the residual and the released sum: such
        # coordinates enter the pipeline as zero, whose clips then bound the upload as
        # any other (the select fuses into the ravel; the count is one read of it)
        bad = ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(upload)]))
        upload = jax.tree.map(lambda a: jnp.where(jnp.isfinite(a), a, 0.0), upload)
        bad = bad & took_part
      flat, unravel = ravel_pytree(upload)
      stage_ctx = pipeline_lib.StageContext(
          key=jax.random.fold_in(pipeline_key, cid), num_examples=count, lr=lr,
          public_update=server_state.get("public_update", jnp.zeros_like(flat)),
          hp=client_hp["pipeline"])
      sent, pstate, pipeline_metrics = client_pipeline.update(
          pipeline_lib.Upload(flat, jnp.ones(flat.shape, bool)), cstate["pipeline"], stage_ctx)
      cstate["pipeline"] = (jax.tree.map(lambda a, b: jnp.where(took_part, a, b), pstate,
                                         cstate["pipeline"]) if keep_rows else pstate)
      upload = unravel(sent.values)
      if stages.aggregate_noise:  # the noise this upload owes, drawn below for the sum
        owed = (sent.sent, jnp.asarray(sent.noise_std, jnp.float32))
    if not summed:
      return (res._replace(delta=upload, params=()), contrib, owed, bad, (),
              pipeline_metrics), cstate
    norm = ()
    if dp_client is not None:   # always finite: a non-finite upload is sent as zero
      upload, norm = dp_client(upload, cid)
    uniform = upload_stages.uniform_weights(stages.uploads)
    w = (took_part if uniform else count).astype(jnp.float32)
    out = {"delta": jax.tree.map(lambda a: w * a, upload)}
    if owed:  # the owed noise's variance on the weighted sum (aggregate_noise_var)
      out["noise_var"] = jnp.square(w * owed[1]) * owed[0].astype(jnp.float32)
    if stages.summed_reports:
      out["report_var"] = jnp.square(w * client_noise_factor[cid])
    return ((res._replace(delta=(), params=()), contrib, (), bad, norm, pipeline_metrics),
            out), cstate
  return one


def _robust_aggregate(deltas, cohort_ids, cohort_mask, weights, server_state, hp, rule,
                      takes_ids: bool):
  """A robust rule over every upload: the cohort all-gathered over the devices,
  aggregated replicated (given the uploads' client ids where it `takes_ids`).
  Returns (aggregate, the rule's metrics, server-state slots: the rule's new state
  where it keeps one)."""
  rows = jax.vmap(lambda t: ravel_pytree(t)[0])(deltas)
  all_rows, all_mask = gather_over_devices(rows), gather_over_devices(cohort_mask)
  all_weights = gather_over_devices(weights)
  unravel = ravel_pytree(jax.tree.map(lambda d: d[0], deltas))[1]
  # (u, mask, weights, state, hp[, ids]) -> (aggregate, state, metrics); the rule's
  # state, replicated, lives in server_state["aggregator"] when it keeps one
  ids = (gather_over_devices(cohort_ids),) if takes_ids else ()
  agg, agg_state, metrics = rule(all_rows, all_mask, all_weights,
                                 server_state.get("aggregator", ()), hp, *ids)
  slots = {"aggregator": agg_state} if "aggregator" in server_state else {}
  return unravel(agg), metrics, slots


def _linear_aggregate(deltas, weights, mask_f, counts, sums, owed, round_key, *,
                      report_std, divides_by: str, uniform: bool, aggregate_noise: bool):
  """The weighted sum of the uploads over the devices (summed in the client loop
  where `sums`), plus the kept-coordinate noise owed to it in one draw, and local
  DP's reports' noise in one draw where `report_std` (each leaf's std of one
  report's noise: the sum of the cohort's independent N(0, (w_i f_i s)^2) is
  N(0, s^2 sum_i (w_i f_i)^2), the same distribution, other bits); divided by
  the total weight (FedAvg: n, shuffled or local DP: participants), or the plain
  sum under central DP (the server noises the sum and divides)."""
  if sums is not None:   # weight_of(...) is weights * mask_f, summed in the loop
    delta_sum = sum_over_devices(sums["delta"])
  else:
    delta_sum = sum_over_devices(weighted_mean.weighted_sum(weights, deltas))
  if report_std is not None:
    total = jnp.sqrt(sum_over_devices(sums["report_var"]))
    delta_sum = gaussian_noise.add_gaussian_noise(
        delta_sum, jax.random.fold_in(round_key, REPORT_NOISE_SUM),
        [s * total for s in report_std])
  if aggregate_noise:
    # sum_i w_i n_i for the owed kept-coordinate noise, in one draw of the same
    # distribution (pipeline.gaussian_on_kept). The weights pair with their own
    # client's mask and std: shuffling is per layer but its weights are uniform.
    if sums is not None:
      var = sums["noise_var"]
    else:
      sent, noise_std = owed
      var = pipeline_lib.aggregate_noise_var(weights * mask_f, noise_std, sent)
    std = jnp.sqrt(sum_over_devices(var))
    flat, unravel = ravel_pytree(delta_sum)
    noise = std * jax.random.normal(jax.random.fold_in(round_key, KEPT_NOISE), flat.shape)
    delta_sum = unravel(flat + noise)
  if divides_by == "expected_cohort":   # the mechanism's release divides
    return delta_sum
  total_weight = sum_over_devices(jnp.sum(mask_f if uniform else counts, dtype=jnp.float32))
  return jax.tree.map(lambda d: d / jnp.maximum(total_weight, 1.0), delta_sum)


def client_hparams(hp: dict, round_index, *, schedule: str, rounds: int, momentum: bool,
                   mechanism_keys: tuple = ()) -> dict:
  """What the client phase reads of the hyperparameters this round: the lr, the
  local terms', the aggregator's and the upload stages' numbers, momentum and
  those the mechanism's client half reads (`mechanism_keys`: local DP's noise)."""
  out = {"lr": round_learning_rate(hp, round_index, schedule, rounds), "terms": hp["terms"],
         "aggregator": hp["aggregator"], "pipeline": hp["pipeline"]}
  if momentum:
    out["momentum"] = hp["momentum"]
  out.update({k: hp[k] for k in mechanism_keys})
  if "audit_canary_scale" in hp:
    out["audit_canary_scale"] = hp["audit_canary_scale"]
  return out


