"""`fedjax-dp` command line: `run`, `sweep`, `compare`, `profile`, `config`, `datasets`,
`account`.

Every user error (bad config key or value, missing or corrupt data, an output
folder that would be overwritten) prints one line `error: ...` to stderr and
exits with status 2, without a traceback and without touching earlier results.
A run that diverged (its model or test metrics not finite) stops there, keeps its
outputs and exits with status 3 after one line; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import gc
import os
import sys
import traceback
import warnings

from fedjax_dp.experiment import interrupts

USER_ERROR = 2
INTERRUPTED = 130


def _run(args) -> int:
  from fedjax_dp.config import load_config, make_config, parse_set
  from fedjax_dp.errors import RunError
  from fedjax_dp.experiment.run_folder import saved_config
  from fedjax_dp.experiment.runner import run_experiment

  if args.out is None and (args.resume or not args.print_config):
    raise RunError("fedjax-dp run: --out is required (the run's folder; with --resume, the "
                   "run to continue)")
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
    from fedjax_dp.experiment import divergence
    print(f"error: {divergence.message(summary['diverged'], out)}", file=sys.stderr)
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
  elif privacy.get("dp") != "none" or "kept_noise" in privacy:
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
  runs = compare.load_runs(args.paths)
  rows = compare.sort_rows(compare.compare_rows(runs), args.sort)
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


def _profile(args) -> int:
  """A profiler trace of --rounds compiled rounds and their top operations (profile.py)."""
  from fedjax_dp.config import load_config
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
  from fedjax_dp.config import load_config
  from fedjax_dp.experiment import audit_run
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
    print(audit_run.format_runs_report(report))
    print(f"report:  {os.path.abspath(os.path.join(args.out, 'audit.json'))}")
    return 0
  if args.confidence is not None:
    raise RunError("fedjax-dp audit: --confidence is the multi-run bound's (--runs); the "
                   "one-shot audit reports a 95 % bootstrap interval")
  report = audit_run.audit(cfg, out=args.out, canaries=args.canaries or 100,
                           held_out=args.held_out, bootstrap=args.bootstrap,
                           progress=not args.no_progress, undercharge=args.undercharge,
                           all_iterates=args.all_iterates)
  print(audit_run.format_report(report))
  print(f"report:  {os.path.abspath(os.path.join(args.out, 'audit.json'))}")
  return 0


def _datasets(args) -> int:
  from fedjax_dp.config import load_config
  from fedjax_dp.data.registry import DATASETS, find_dataset

  from fedjax_dp.errors import RunError
  if args.plot and not args.partition:
    raise RunError("--plot needs --partition (it plots the partition's label histogram)")
  if args.plot and not args.plot.lower().endswith(".png"):
    raise RunError(f"--plot {args.plot}: expected a .png file name")
  if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
    raise RunError(f"--plot {args.plot}: its folder does not exist")
  if not args.partition:
    for name in DATASETS:
      ok, where = find_dataset(name, args.data_dir)
      print(f"{name:10s} {'available' if ok else 'missing  '}  {where}")
    return 0
  from fedjax_dp.data import partition as part_lib
  from fedjax_dp.experiment.setup import client_partition, load_data
  sets = list(args.set)
  if args.data_dir:
    sets.append(f"data_dir={args.data_dir}")
  cfg = load_config(args.config, sets)
  ds = load_data(cfg)
  parts = client_partition(cfg, ds)
  hist = part_lib.label_histogram(ds.y_train, parts, ds.num_classes)
  print(f"{cfg.dataset}: {len(ds.y_train)} training examples, {cfg.num_clients} clients, "
        f"partition {cfg.partition}" + (f" (alpha {cfg.alpha})" if cfg.partition == "dirichlet" else ""))
  print(part_lib.format_histogram(hist))
  if args.plot:
    from fedjax_dp.data.registry import CLASS_NAMES
    names = CLASS_NAMES.get(cfg.dataset)
    part_lib.plot_histogram(
        hist, args.plot, class_names=names if names and len(names) == ds.num_classes else None,
        title=f"{cfg.dataset}: {cfg.num_clients} clients, partition {cfg.partition}")
    print(f"plot: {os.path.abspath(args.plot)}")
  return 0


def _config(args) -> int:
  """Every config key with its default, allowed values and meaning; `--show KEY`
  one key in full (and the setting that makes it read)."""
  import json
  from fedjax_dp.experiment import config_reference as reference
  from fedjax_dp.config.loading import unknown_key_message
  from fedjax_dp.config.schema import _FIELDS
  from fedjax_dp.errors import ConfigError
  if args.markdown and args.show:
    raise ConfigError("fedjax-dp config --markdown prints every key (the README's tables); "
                      "it takes no --show")
  for key in args.show:
    if key not in _FIELDS:
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


def _config_args(parser) -> None:
  """--config and --set, as every command that builds a config takes them."""
  parser.add_argument("--config", help="YAML file of config keys (see README)")
  parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                      help="override config keys: one or more KEY=VALUE")


def _attack_args(parser) -> None:
  """What every `fedjax-dp attack` kind takes: the run, the examples, the report."""
  parser.add_argument("--run", required=True, metavar="DIR", help="a finished run's folder")
  parser.add_argument("--examples", type=_positive_int, default=None,
                      help="members (and non-members) at most; default: the test set's size")
  parser.add_argument("--seed", type=int, default=0,
                      help="which examples are drawn (default 0)")
  parser.add_argument("--json", metavar="JSON", help="also write the report here (a new file)")
  parser.set_defaults(func=_attack)


def _nonnegative_int(text: str) -> int:
  """argparse type: a whole number >= 0."""
  try:
    value = int(text)
  except ValueError:
    value = -1
  if value < 0:
    raise argparse.ArgumentTypeError(f"{text!r}: allowed are whole numbers >= 0")
  return value


def _positive_int(text: str) -> int:
  """argparse type: a whole number >= 1 (a bad value is argparse's one-line error)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: allowed are whole numbers >= 1")
  return value


class OneLineParser(argparse.ArgumentParser):
  """argparse with its usage errors on one line (and exit status 2, as argparse's)."""

  def error(self, message):
    self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
  p = OneLineParser(
      prog="fedjax-dp",
      description="JAX simulator for federated learning with differential privacy.")
  from fedjax_dp import __version__
  p.add_argument("--version", action="version", version=f"fedjax-dp {__version__}")
  sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

  r = sub.add_parser("run", help="run a federated simulation and write its results to --out")
  r.add_argument("--config", help="YAML file of config keys (see README)")
  r.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="override config keys: one or more KEY=VALUE; repeatable")
  r.add_argument("--out", help="output folder (must be empty or absent); required but with "
                 "--print-config")
  r.add_argument("--resume", action="store_true",
                 help="continue the run in --out from its newest readable checkpoint")
  r.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
  r.add_argument("--no-progress", action="store_true", help="no progress bar")
  r.add_argument("--log", nargs="+", action="extend", default=[], choices=("csv", "tensorboard"),
                 metavar="KIND", help="also write the metrics live as csv (metrics.csv) and/or "
                 "tensorboard (tensorboard/ event files); metrics.jsonl is always written")
  r.add_argument("--print-config", action="store_true",
                 help="print the resolved config (config.json's form) and exit without running")
  many = r.add_argument_group(
      "many processes (hosts)", "start the same command in each process; the clients mesh "
      "spans their devices and process 0 writes --out (also $JAX_NUM_PROCESSES, "
      "$JAX_PROCESS_ID, $JAX_COORDINATOR_ADDRESS)")
  many.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
  many.add_argument("--process-id", type=int, metavar="I", help="this process: 0 to N-1")
  many.add_argument("--coordinator", metavar="HOST:PORT",
                    help="address of process 0's coordinator service")
  r.set_defaults(func=_run)

  w = sub.add_parser("sweep", help="run a sweep file's cells (grid, variants, seeds) as "
                     "replicas of as few compiled programs as can be")
  w.add_argument("file", help="sweep YAML file: base, config, seeds, grid, variants, "
                 "replica_batch (README: Sweeps)")
  w.add_argument("--out", help="the sweep's folder (new or empty, or this sweep's: continued)")
  w.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="override config keys of the base config: one or more KEY=VALUE")
  w.add_argument("--replica-batch", metavar="N", help="replicas vmapped together: auto (1 on "
                 "CPU) or N >= 1; overrides the file's replica_batch")
  w.add_argument("--overwrite", action="store_true",
                 help="rerun cells whose folders hold runs with other settings")
  w.add_argument("--no-progress", action="store_true", help="no progress bar")
  w.add_argument("--print-cells", action="store_true",
                 help="print the cells' names (every config checked) and exit without running")
  w.set_defaults(func=_sweep)

  m = sub.add_parser("compare", help="runs and sweeps side by side: final and best metrics, "
                     "epsilon, bytes, time, and the config keys that differ")
  m.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP",
                 help="run folders, and sweep folders (each of their cells)")
  m.add_argument("--sort", metavar="COLUMN", help="sort by a column; =-COLUMN: descending "
                 "(e.g. --sort=-test_accuracy)")
  m.add_argument("--csv", metavar="CSV", help="also write the table here (a new file)")
  m.add_argument("--plot", metavar="PNG", help="the first test metric (and epsilon) against "
                 "rounds, one line per run (a new file)")
  m.set_defaults(func=_compare)

  a = sub.add_parser("attack", help="a privacy attack on a finished run's model")
  kinds = a.add_subparsers(dest="attack", required=True, parser_class=OneLineParser)
  mia = kinds.add_parser("mia", help="membership inference (loss threshold) on a balanced set "
                         "of training (member) and test (non-member) examples")
  _attack_args(mia)
  mia.add_argument("--shadows", type=_nonnegative_int, default=0,
                   help="also the shadow-model attack with this many shadow models (default 0: "
                   "the loss threshold alone)")
  att = kinds.add_parser("attribute", help="attribute inference: guess a sensitive column of "
                         "tabular data from the model's loss on the true label")
  _attack_args(att)
  att.add_argument("--feature", metavar="NAME", help="the column (default: the data's first "
                   "sensitive column with at most 10 values)")

  u = sub.add_parser("audit", help="run with canary clients and estimate the epsilon the "
                     "release shows, beside the accounted one")
  _config_args(u)
  u.add_argument("--canaries", type=_positive_int, default=None,
                 help="canary clients inserted (default 100; below num_clients)")
  u.add_argument("--runs", type=_positive_int, default=None,
                 help="the multi-run audit instead: train this many times (at least 20), "
                      "one canary in half of them")
  u.add_argument("--confidence", type=float, default=None,
                 help="the multi-run lower bound's confidence (default 0.95)")
  u.add_argument("--held-out", type=_positive_int, default=None,
                 help="canary directions held out (default: as many as inserted)")
  u.add_argument("--bootstrap", type=_positive_int, default=1000,
                 help="bootstrap resamples of the interval (default 1000)")
  u.add_argument("--out", help="the audited run's folder (new or empty)")
  u.add_argument("--undercharge", type=float, default=None,
                 help="test mode: the rounds apply this fraction in (0, 1) of the noise the "
                      "accountant charges, to see the audit fail")
  u.add_argument("--all-iterates", action="store_true",
                 help="also estimate for an observer of every round's model (rounds run one "
                      "at a time)")
  u.add_argument("--no-progress", action="store_true", help="no progress bar")
  u.set_defaults(func=_audit)

  f = sub.add_parser("profile", help="trace N compiled rounds with jax.profiler and print "
                     "the operations that took the most time")
  _config_args(f)
  f.add_argument("--rounds", type=_positive_int, default=5,
                 help="rounds in the traced chunk (default 5)")
  f.add_argument("--top", type=_positive_int, default=20, help="operations printed (default 20)")
  f.add_argument("--out", help="the trace's folder (new or empty)")
  f.set_defaults(func=_profile)

  c = sub.add_parser("config", help="list every config key: default, allowed values, meaning")
  c.add_argument("--show", nargs="+", default=[], metavar="KEY",
                 help="one or more keys in full, with the setting that makes each read")
  form = c.add_mutually_exclusive_group()
  form.add_argument("--json", action="store_true", help="as JSON (all keys, or --show's)")
  form.add_argument("--markdown", action="store_true", help="as the README's tables")
  c.set_defaults(func=_config)

  d = sub.add_parser("datasets", help="list datasets, or show a partition's label histogram")
  d.add_argument("--data-dir", help="folder to search for dataset files")
  d.add_argument("--partition", action="store_true",
                 help="print the per-client label histogram of the configured partition")
  d.add_argument("--config", help="YAML config (dataset, num_clients, partition, alpha, ...)")
  d.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
  d.add_argument("--plot", metavar="PNG", help="with --partition: also plot the histogram")
  d.set_defaults(func=_datasets)

  from fedjax_dp.privacy import planning as account
  account.add_parser(sub)
  return p


def run_guarded(fn) -> int:
  """fn() -> exit status, with the command line's handling of user errors (one
  line `error: ...` on stderr, status 2) and of Ctrl-C ('interrupted', 130).
  Also used by the experiment scripts."""
  from fedjax_dp.errors import AccountError
  from fedjax_dp.errors import CheckpointError
  from fedjax_dp.errors import ConfigError
  from fedjax_dp.errors import DataError
  from fedjax_dp.errors import RunError
  try:
    with interrupts.installed():   # a Ctrl-C is never lost (interrupts.py)
      return fn()
  except (ConfigError, DataError, RunError, CheckpointError, AccountError) as e:
    print(f"error: {e}", file=sys.stderr)
    return USER_ERROR
  except (KeyboardInterrupt, Exception) as e:
    # a Ctrl-C, or an error a library's cleanup raised while a Ctrl-C unwound through it
    # (seen once: orbax, cut short mid-save): the Ctrl-C is what happened
    if not _raised_by_an_interrupt(e):
      raise
    _free_quietly(e)
    print(interrupted_line(), file=sys.stderr)
    return INTERRUPTED


def _raised_by_an_interrupt(e: BaseException) -> bool:
  """Is `e` a KeyboardInterrupt, or was it raised while one was being handled (its
  __context__ or __cause__ chain holds one)?"""
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, KeyboardInterrupt):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False


def _free_quietly(interrupt: BaseException) -> None:
  """Frees the interrupted frames now, their teardown's complaints silenced. An
  orbax save cut short leaves an event loop and coroutines in them, which print
  'Exception ignored' and 'never awaited' on stderr when freed; this used to happen
  after 'interrupted', so that the promised one line became twelve."""
  hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      traceback.clear_frames(interrupt.__traceback__)
      gc.collect()
  finally:
    sys.unraisablehook = hook


def main(argv: list[str] | None = None) -> int:
  _INTERRUPTED_RUN.clear()
  args = build_parser().parse_args(argv)
  from fedjax_dp.placement import processes
  from fedjax_dp.placement.host import use_cpu_devices_or_exit
  use_cpu_devices_or_exit()  # before JAX starts: one CPU device per core

  def start_and_run() -> int:
    if args.command == "run":   # also before JAX starts
      processes.start_processes(args.num_processes, args.process_id, args.coordinator)
    return args.func(args)
  return run_guarded(start_and_run)


def exit_with(code: int) -> None:
  """sys.exit(code), except that after Ctrl-C the process exits without waiting
  for the checkpointer's background threads (their teardown printed tracebacks
  after 'interrupted'). Leaving them unfinished is safe: an unfinished
  checkpoint is never listed (orbax renames it into place when complete), as
  after a kill."""
  if code == INTERRUPTED:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  sys.exit(code)


def console_main() -> None:
  """The `fedjax-dp` command."""
  try:
    code = main()
    sys.stdout.flush()
  except BrokenPipeError:
    # the reader went away (`fedjax-dp run --print-config | head`): no traceback, and
    # stdout pointed at devnull so that the interpreter's own flush at exit is quiet too
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
  exit_with(code)


if __name__ == "__main__":
  console_main()
