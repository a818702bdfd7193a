"""The `fedjax-dp` commands: each takes the parsed arguments and returns the exit
status (the package's run_guarded turns a user error into one line and status 2)."""

from __future__ import annotations

import json
import os
import sys


def _run(args) -> int:
  from fedjax_dp.config import parse_set
  from fedjax_dp.recipes.config_checks import load_config, make_config
  from fedjax_dp.errors import RunError
  from fedjax_dp.experiment.run_folder import check_resume_or_overwrite, saved_config
  from fedjax_dp.experiment.runner import run_experiment

  if args.out is None and (args.resume or not args.print_config):
    raise RunError("fedjax-dp run: --out is required (the run's folder; with --resume, the "
                   "run to continue)")
  check_resume_or_overwrite(args.out, args.resume, args.overwrite)   # before --resume reads
  if args.resume and not args.config:
    cfg_path = os.path.join(args.out, "config.json")
    if not os.path.exists(cfg_path):
      raise RunError(f"--resume: {args.out} holds no run (no config.json)")
    cfg = make_config(parse_set(args.set), base=saved_config(cfg_path))
  else:
    cfg = load_config(args.config, args.set)
  if args.print_config:   # resolved and checked as a run would be; nothing runs or is written
    if args.log:
      raise RunError(f"--log {' '.join(args.log)} with --print-config: nothing runs, so "
                     "nothing would be logged")
    print(cfg.to_json())
    return 0
  from fedjax_dp.experiment.callbacks import log_metrics
  from fedjax_dp.experiment.writers import writers_for
  live = [log_metrics(*writers_for(args.log, args.out))] if args.log else []
  # for the line after a Ctrl-C (kept while the interrupt unwinds to run_guarded)
  _INTERRUPTED_RUN[:] = [(args.out, cfg.checkpoint_every)]
  summary = run_experiment(cfg, args.out, resume=args.resume, overwrite=args.overwrite,
                           progress=not args.no_progress, callbacks=live)
  _INTERRUPTED_RUN.clear()
  from fedjax_dp.placement.processes import is_primary
  if not is_primary():
    return 0   # process 0 reports
  final = summary["final"]
  out = os.path.abspath(args.out)
  if summary.get("diverged"):
    from fedjax_dp.experiment import divergence, noise_note
    ratio = noise_note.reported_ratio(cfg, summary["privacy"])
    print(f"error: {divergence.message(summary['diverged'], out, divergence.advice(ratio))}",
          file=sys.stderr)
    return divergence.DIVERGED
  if final:
    print(final_line(final, summary["privacy"]))
  print(f"results: {out}/metrics.jsonl, {out}/summary.json")
  print(f"model:   {out}/model.msgpack (fedjax_dp.load_params)")
  if summary.get("plots"):
    print("plots:   " + ", ".join(os.path.abspath(p) for p in summary["plots"]))
  return 0


# (out, checkpoint_every) of the run under way, or ('sweep', the command that continues it)
_INTERRUPTED_RUN: list[tuple] = []


def interrupted_line() -> str:
  """'interrupted', and for a run, the command that continues it and from where."""
  if not _INTERRUPTED_RUN:
    return "interrupted"
  import shlex
  from fedjax_dp.experiment.checkpoint import steps
  if _INTERRUPTED_RUN[0][0] == "sweep":
    return (f"interrupted; `{_INTERRUPTED_RUN[0][1]}` keeps the finished cells and continues "
            "the others")
  out, every = _INTERRUPTED_RUN[0]
  if not os.path.isfile(os.path.join(out, "config.json")):   # --resume would find no run
    return f"interrupted before anything was written to {out}: run the same command again"
  done = steps(os.path.join(out, "checkpoints")) if os.path.isdir(out) else []
  command = f"fedjax-dp run --resume --out {shlex.quote(out)}"
  if done:
    return f"interrupted; `{command}` continues from the checkpoint at round {max(done)}"
  why = "checkpoint_every 0" if not every else "before the first checkpoint"
  return f"interrupted ({why}, no checkpoint): `{command}` starts over from round 0"


def final_line(final: dict, privacy: dict) -> str:
  """The last line of a run: its last evaluation and its one guarantee."""
  shown = ", ".join(f"{k.replace('_', ' ')} {final[k]:.4f}" for k in final
                    if k.startswith("test_") and final[k] is not None)
  if privacy.get("epsilon") is not None:
    shown += (f", epsilon {privacy['epsilon']:.4g} ({privacy['epsilon_accountant']}, delta "
              f"{privacy['delta']:g})")
  elif "assumes" in privacy:   # the run claims a guarantee (privacy_report.has_guarantee)
    shown += f", no epsilon: {privacy['epsilon_why_none']}"
  return f"round {final['round']}: {shown}"


def _sweep(args) -> int:
  """A sweep file's cells into --out (sweeps/run.py); prints each setting's final figures."""
  import dataclasses
  from fedjax_dp.sweeps import load_sweep, run_sweep
  from fedjax_dp.sweeps.spec import replica_batch_value
  spec = load_sweep(args.file, args.set)
  if args.replica_batch is not None:
    spec = dataclasses.replace(spec, replica_batch=replica_batch_value(args.replica_batch,
                                                                       "--replica-batch"))
  if args.print_cells:   # every cell's config checked; nothing runs or is written
    for cell in spec.cells():
      print(cell.name)
    return 0
  from fedjax_dp.errors import RunError
  if args.out is None:
    raise RunError("fedjax-dp sweep: --out is required (the sweep's folder)")
  import shlex
  again = ["fedjax-dp", "sweep", args.file, "--out", args.out]
  again += ["--set", *args.set] if args.set else []
  again += ["--replica-batch", args.replica_batch] if args.replica_batch is not None else []
  _INTERRUPTED_RUN[:] = [("sweep", shlex.join(again))]
  record = run_sweep(spec, args.out, overwrite=args.overwrite, progress=not args.no_progress)
  _INTERRUPTED_RUN.clear()
  out = os.path.abspath(args.out)
  if record.get("final"):
    from fedjax_dp.sweeps.table import final_lines
    print("\n".join(final_lines(record["final"])))
  print(f"results: {out}/results.csv, {out}/results.parquet, {out}/final.csv")
  print(f"cells:   {out}/cells/<cell>/ (ordinary run folders)")
  if record.get("plots"):
    print("plots:   " + ", ".join(os.path.abspath(p) for p in record["plots"]))
  if record.get("plots_skipped"):
    print(f"plots:   none ({record['plots_skipped']})")
  return 0


def _import_plugins(plugins: list[str]) -> None:
  """--plugins: registrations a saved run's config names (a ConfigError names the one
  that failed to import)."""
  from fedjax_dp.recipes.plugins import load_plugins
  load_plugins(tuple(plugins), named="--plugins")


def _compare(args) -> int:
  """Runs and sweeps side by side (experiment/compare.py)."""
  from fedjax_dp.experiment import compare, reporting
  from fedjax_dp.errors import RunError
  for flag, path, ext in (("--plot", args.plot, ".png"), ("--csv", args.csv, ".csv")):
    if path is None:
      continue
    if not path.lower().endswith(ext):
      raise RunError(f"{flag} {path}: expected a {ext} file name")
    if os.path.exists(path):
      raise RunError(f"{flag} {path}: the file exists; name a new one")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
      raise RunError(f"{flag} {path}: its folder does not exist")
  _import_plugins(args.plugins)
  runs = compare.load_runs(args.paths)
  rows = compare.select_columns(compare.sort_rows(compare.compare_rows(runs), args.sort),
                                args.columns)
  print(compare.format_table(rows))
  if args.csv:
    reporting.write_text_atomic(args.csv, reporting.csv_text(rows))
    print(f"table: {os.path.abspath(args.csv)}")
  if args.plot:
    print(f"plot:  {os.path.abspath(compare.plot_runs(runs, args.plot))}")
  return 0


def _attack(args) -> int:
  """A privacy attack on a finished run's model (experiment/attack.py)."""
  from fedjax_dp.experiment import attack, reporting
  from fedjax_dp.errors import RunError
  if args.json is not None:
    if not args.json.lower().endswith(".json"):
      raise RunError(f"--json {args.json}: expected a .json file name")
    if os.path.exists(args.json):
      raise RunError(f"--json {args.json}: the file exists; name a new one")
  if not os.path.isdir(args.run):
    raise RunError(f"--run {args.run}: no such folder")
  _import_plugins(args.plugins)
  if args.attack == "mia":
    report = attack.attack_mia(args.run, examples=args.examples, seed=args.seed,
                               shadows=args.shadows)
    print(attack.format_report(report))
  else:
    report = attack.attack_attribute(args.run, feature=args.feature, examples=args.examples,
                                     seed=args.seed)
    print(attack.format_attribute(report))
  if args.json:
    reporting.write_text_atomic(args.json, json.dumps(report, indent=2) + "\n")
    print(f"report: {os.path.abspath(args.json)}")
  return 0


# `fedjax-dp account`'s options that a run config states itself (config key, option)
_ACCOUNT_NUMBERS = (("q", "--q"), ("noise_multiplier", "--noise-multiplier"),
                    ("target_epsilon", "--target-epsilon"), ("steps", "--steps"),
                    ("delta", "--delta"), ("accountant", "--accountant"),
                    ("sampling", "--sampling"), ("population", "--population"),
                    ("eps0", "--eps0"), ("n", "--n"))


def _account(args) -> int:
  """`fedjax-dp account`: from the numbers (privacy/planning.py), or from a run config
  as the run is charged (experiment/plan_privacy.py)."""
  from fedjax_dp.privacy import planning
  if args.config is None and not args.set:
    accountant, sampling = args.accountant or "rdp", args.sampling or "poisson"
    if args.kind == "shuffle":
      res = planning.account_shuffle(args.eps0, args.n, args.delta)
    else:
      res = planning.account_dpsgd(args.q, args.noise_multiplier, args.steps, args.delta,
                                   accountant, args.target_epsilon, sampling, args.population)
    print(json.dumps(res) if args.json else planning.format_result(res))
    return 0
  from fedjax_dp.errors import ConfigError
  from fedjax_dp.experiment import plan_privacy
  from fedjax_dp.recipes.config_checks import load_config
  for key, option in _ACCOUNT_NUMBERS:
    if getattr(args, key) is not None:
      name = {"q": "clients_per_round", "steps": "rounds", "population": "num_clients"}.get(
          key, key)
      raise ConfigError(f"fedjax-dp account: {option} with --config/--set: the config states "
                        f"it; override it with --set {name}=VALUE")
  if args.kind == "shuffle":
    raise ConfigError("fedjax-dp account shuffle: --config/--set plan a DP run (dpsgd); shuffle "
                      "takes --eps0, --n and --delta")
  res = plan_privacy.plan(load_config(args.config, args.set))
  print(json.dumps(res) if args.json else plan_privacy.format_plan(res))
  return 0


def _profile(args) -> int:
  """A profiler trace of --rounds compiled rounds and their top operations (profile.py)."""
  from fedjax_dp.recipes.config_checks import load_config
  from fedjax_dp.experiment import profile
  from fedjax_dp.errors import RunError
  if args.out is None:
    raise RunError("fedjax-dp profile: --out is required (the trace's folder)")
  profile.check_out(args.out)
  cfg = load_config(args.config, args.set)
  result = profile.profile_rounds(cfg, args.rounds, args.out)
  out = os.path.abspath(args.out)
  print(f"{args.rounds} rounds in {result['traced_chunk_s']:.3f} s traced "
        f"({result['seconds_per_round']:.4f} s a round; the untraced first chunk, compiling, "
        f"{result['first_chunk_s']:.2f} s) on {result['devices']} {result['platform']} "
        f"device(s); the top {min(args.top, len(result['rows']))} of {len(result['rows'])} "
        "operations:")
  print(profile.format_top(result["rows"], args.top))
  trace = next((p for p in result["trace_files"] if p.endswith(".trace.json.gz")), None)
  print(f"ops:     {out}/ops.csv (every operation), {out}/profile.json")
  if trace:
    print(f"trace:   {os.path.abspath(trace)} (Perfetto: ui.perfetto.dev, Open trace file)")
  print(f"tensorboard --logdir {out}   (with tensorboard-plugin-profile installed)")
  return 0


def _audit(args) -> int:
  """An empirical privacy audit with canary clients (experiment/audit_run.py)."""
  from fedjax_dp.recipes.config_checks import load_config
  from fedjax_dp.experiment import audit_run, audit_text
  from fedjax_dp.errors import RunError
  if args.out is None:
    raise RunError("fedjax-dp audit: --out is required (the audited run's folder)")
  cfg = load_config(args.config, args.set)
  if args.runs is not None:
    given = [f for f, v in (("--canaries", args.canaries), ("--held-out", args.held_out),
                            ("--all-iterates", args.all_iterates or None)) if v is not None]
    if given:
      raise RunError(f"fedjax-dp audit: {given[0]} with --runs: the multi-run audit has one "
                     "canary and reads the final model (leave it out, or leave out --runs)")
    report = audit_run.audit_runs(cfg, out=args.out, runs=args.runs, bootstrap=args.bootstrap,
                                  confidence=0.95 if args.confidence is None else
                                  args.confidence, progress=not args.no_progress,
                                  undercharge=args.undercharge)
    print(audit_text.format_runs_report(report))
    print(f"report:  {os.path.abspath(os.path.join(args.out, 'audit.json'))}")
    return 0
  report = audit_run.audit(cfg, out=args.out, canaries=args.canaries or 100,
                           held_out=args.held_out, bootstrap=args.bootstrap,
                           progress=not args.no_progress, undercharge=args.undercharge,
                           all_iterates=args.all_iterates,
                           confidence=0.95 if args.confidence is None else args.confidence)
  print(audit_text.format_report(report))
  print(f"report:  {os.path.abspath(os.path.join(args.out, 'audit.json'))}")
  return 0


def _load_listed_plugins(args) -> None:
  """Imports the plugins --config or --set name (without checking the rest)."""
  from fedjax_dp.config import _coerce, parse_set, read_config_file
  from fedjax_dp.recipes.plugins import load_plugins
  raw = {**(read_config_file(args.config) if args.config else {}), **parse_set(args.set)}
  load_plugins(_coerce("plugins", raw.get("plugins", [])))


def _datasets(args) -> int:
  from fedjax_dp.recipes.config_checks import load_config
  from fedjax_dp.data.registry import DATASETS, find_dataset

  from fedjax_dp.errors import RunError
  if args.write_sample:
    return _write_sample(args)
  if args.out:
    raise RunError("--out is read with --write-sample only")
  if args.plot and not args.partition:
    raise RunError("--plot needs --partition (it plots the partition's label histogram)")
  if args.plot and not args.plot.lower().endswith(".png"):
    raise RunError(f"--plot {args.plot}: expected a .png file name")
  if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
    raise RunError(f"--plot {args.plot}: its folder does not exist")
  if not args.partition:
    _load_listed_plugins(args)   # a plugin's datasets are listed too
    width = max(len(name) for name in DATASETS)   # a long name (breast_cancer) kept aligned
    for name in DATASETS:
      ok, where = find_dataset(name, args.data_dir)
      print(f"{name:{width}s}  {'available' if ok else 'missing  '}  {where}")
    return 0
  from fedjax_dp.data import partition as part_lib
  from fedjax_dp.experiment.setup import client_partition, load_data
  sets = list(args.set)
  if args.data_dir:
    sets.append(f"data_dir={args.data_dir}")
  cfg = load_config(args.config, sets)
  ds = load_data(cfg)
  parts = client_partition(cfg, ds)
  described = f"partition {cfg.partition}" + (
      f" (alpha {cfg.alpha:g})" if cfg.partition in ("dirichlet", "dirichlet_client") else "")
  used = sum(len(p) for p in parts)
  unused = (f" ({len(ds.y_train) - used} in no client's part)" if used < len(ds.y_train)
            else "")
  print(f"{cfg.dataset}: {len(ds.y_train)} training examples{unused}, {cfg.num_clients} "
        f"clients, {described}")
  if ds.y_train.ndim != 1:   # token sequences: no label to count
    if args.plot:
      raise RunError(f"--plot with dataset {cfg.dataset!r}: its targets are token sequences "
                     f"{ds.y_train.shape[1:]}, with no class labels to plot")
    print(part_lib.format_sequence_sizes(parts, ds.y_train.shape[1:]))
    return 0
  hist = part_lib.label_histogram(ds.y_train, parts, ds.num_classes)
  print(part_lib.format_histogram(hist))
  if args.plot:
    from fedjax_dp.data.registry import class_names
    names = class_names(cfg.dataset)
    part_lib.plot_histogram(
        hist, args.plot, class_names=names if names and len(names) == ds.num_classes else None,
        title=f"{cfg.dataset}: {cfg.num_clients} clients, {described}")
    print(f"plot: {os.path.abspath(args.plot)}")
  return 0


def _write_sample(args) -> int:
  """`fedjax-dp datasets --write-sample NAME --out DIR`: files in NAME's real format."""
  from fedjax_dp.data.sample_files import write_sample
  from fedjax_dp.errors import RunError
  if not args.out:
    raise RunError("--write-sample needs --out DIR (a new or empty folder)")
  if args.partition or args.plot or args.config or args.set:
    raise RunError("--write-sample takes --out, --clients and --examples only")
  for flag, value in (("--clients", args.clients), ("--examples", args.examples)):
    if value < 2:
      raise RunError(f"{flag} {value:g}: must be >= 2")
  paths = write_sample(args.write_sample, args.out, args.clients, args.examples)
  print(f"{args.write_sample}: {args.clients} clients of generated examples in its real format")
  for path in paths:
    print(f"  {path}")
  print(f"run: fedjax-dp run --set dataset={args.write_sample} data_dir={args.out} "
        "partition=natural_id ...")
  return 0


def _config(args) -> int:
  """Every config key with its default, allowed values and meaning, the keys of the
  plugins --config or --set name included; `--show KEY` one key in full (and the
  setting that makes it read)."""
  import json
  from fedjax_dp.experiment import config_reference as reference
  from fedjax_dp.config.loading import unknown_key_message
  from fedjax_dp.config.schema import _FIELDS
  from fedjax_dp.errors import ConfigError
  if args.markdown and (args.show or args.config or args.set):
    raise ConfigError("fedjax-dp config --markdown prints the built-in keys (the README's "
                      "tables); it takes no --show, --config or --set")
  other = sorted({item.partition("=")[0] for item in args.set} - {"plugins"})
  if other:
    raise ConfigError(f"fedjax-dp config --set {other[0]}: only plugins is read here (their "
                      "keys are listed with the built-in ones)")
  _load_listed_plugins(args)
  for key in args.show:
    if key not in _FIELDS and key not in reference.PLUGIN_KEYS:
      raise ConfigError(unknown_key_message(key))
  if args.json:
    refs = [reference.reference(k) for k in args.show] or reference.all_references()
    print(json.dumps([r.to_dict() for r in refs], indent=2))
  elif args.markdown:
    print(reference.markdown(), end="")
  elif args.show:
    print("\n".join(reference.detail(k) for k in args.show), end="")
  else:
    print(reference.listing(), end="")
  return 0
