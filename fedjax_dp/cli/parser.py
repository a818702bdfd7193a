"""The `fedjax-dp` argument parser: one function per command adds its arguments."""

from __future__ import annotations

import argparse
import re
import sys

from fedjax_dp.cli.commands import (_account, _attack, _audit, _compare, _config, _datasets,
                                    _profile, _run, _sweep)


def _config_args(parser) -> None:
  """--config and --set, as every command that builds a config takes them."""
  parser.add_argument("--config", help="YAML file of config keys (docs: Config keys)")
  parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                      help="override config keys: one or more KEY=VALUE")


def _plugins_arg(parser) -> None:
  """--plugins: the user's files or modules imported before a saved run is read."""
  parser.add_argument("--plugins", nargs="+", default=[], metavar="FILE_OR_MODULE",
                      help="import these first (a run made from Python whose rule, term, "
                           "mechanism or dataset was registered in your own code)")


def _attack_args(parser) -> None:
  """What every `fedjax-dp attack` kind takes: the run, the examples, the report."""
  parser.add_argument("--run", required=True, metavar="DIR", help="a finished run's folder")
  _plugins_arg(parser)
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
  """argparse with its usage errors on one line (and exit status 2, as argparse's),
  naming the command the option belongs to and the nearest option it knows."""

  def error(self, message):
    option = re.match(r"argument (--\S+?)(/\S+)?: expected one argument$", message)
    if option and _follows(option.group(1)).startswith("-"):
      # `--sort -test_accuracy`: argparse reads -test_accuracy as an option
      message += f" (a value that starts with '-' is written {option.group(1)}=-VALUE)"
    elif "unrecognized arguments" not in message:   # an unknown option may be the cause
      message += _did_you_mean(self, [w for w in _ARGV if w.startswith("--")])
    self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")

  def parse_args(self, args=None, namespace=None):
    _ARGV[:] = list(sys.argv[1:] if args is None else args)
    parsed, extras = self.parse_known_args(args, namespace)
    if extras:   # argparse would blame the top command; the chosen one knows its options
      command = _chosen(self, parsed)
      if getattr(parsed, "command", None) in _ARGV and \
         _ARGV.index(extras[0]) < _ARGV.index(parsed.command):
        command = self   # given before the command (`fedjax-dp --verbose run`)
      command.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(command, extras)}")
    return parsed


_ARGV: list[str] = []   # the command line being parsed, for the error's hints


def _follows(option: str) -> str:
  """The word after `option` on the command line ('' at the end)."""
  if option in _ARGV and _ARGV.index(option) + 1 < len(_ARGV):
    return _ARGV[_ARGV.index(option) + 1]
  return ""


def _chosen(parser: argparse.ArgumentParser, parsed) -> argparse.ArgumentParser:
  """The (sub-)command `parsed` ran: `fedjax-dp run`, `fedjax-dp attack mia`."""
  for action in parser._actions:   # argparse keeps sub-parsers here and nowhere public
    if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None):
      return _chosen(action.choices[getattr(parsed, action.dest)], parsed)
  return parser


def _did_you_mean(parser: argparse.ArgumentParser, extras: list[str]) -> str:
  """' (did you mean --out?)' for the first unknown option near one the command takes."""
  import difflib
  known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
  names = {o[2:]: o for o in known}   # compared without the shared '--'
  for word in extras:
    if word.startswith("--") and word.split("=")[0] not in known:
      near = difflib.get_close_matches(word.split("=")[0][2:], names, n=1, cutoff=0.6)
      if near:
        return f" (did you mean {names[near[0]]}?)"
  return ""


def build_parser() -> argparse.ArgumentParser:
  """The `fedjax-dp` parser: each command's arguments and the function that runs it."""
  p = OneLineParser(
      prog="fedjax-dp",
      description="JAX simulator for federated learning with differential privacy.")
  from fedjax_dp import __version__
  p.add_argument("--version", action="version", version=f"fedjax-dp {__version__}")
  sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
  _run_command(sub)
  _sweep_command(sub)
  _compare_command(sub)
  _attack_command(sub)
  _audit_command(sub)
  _profile_command(sub)
  _config_command(sub)
  _datasets_command(sub)
  _account_command(sub)
  return p


def _run_command(sub) -> None:
  """`fedjax-dp run` and its arguments."""
  r = sub.add_parser("run", help="run a federated simulation and write its results to --out")
  r.add_argument("--config", help="YAML file of config keys (docs: Config keys)")
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


def _sweep_command(sub) -> None:
  """`fedjax-dp sweep` and its arguments."""
  w = sub.add_parser("sweep", help="run a sweep file's cells (grid, variants, seeds) as "
                     "replicas of as few compiled programs as can be")
  w.add_argument("file", help="sweep YAML file: base, config, seeds, grid, variants, "
                 "replica_batch (docs: Sweeps)")
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


def _compare_command(sub) -> None:
  """`fedjax-dp compare` and its arguments."""
  m = sub.add_parser("compare", help="runs and sweeps side by side: final and best metrics, "
                     "epsilon, bytes, time, and the config keys that differ")
  m.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP",
                 help="run folders, and sweep folders (each of their cells)")
  m.add_argument("--sort", metavar="COLUMN", help="sort by a column; =-COLUMN: descending "
                 "(e.g. --sort=-test_accuracy)")
  _plugins_arg(m)
  m.add_argument("--columns", metavar="COLS", help="only these columns, comma-separated "
                 "(the run's name always first), e.g. test_accuracy,epsilon,guarantee")
  m.add_argument("--csv", metavar="CSV", help="also write the table here (a new file)")
  m.add_argument("--plot", metavar="PNG", help="the first test metric (and epsilon) against "
                 "rounds, one line per run (a new file)")
  m.set_defaults(func=_compare)


def _attack_command(sub) -> None:
  """`fedjax-dp attack` and its arguments."""
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


def _audit_command(sub) -> None:
  """`fedjax-dp audit` and its arguments."""
  u = sub.add_parser("audit", help="run with canary clients and estimate the epsilon the "
                     "release shows, beside the accounted one")
  _config_args(u)
  u.add_argument("--canaries", type=_positive_int, default=None,
                 help="canary clients inserted (default 100; below num_clients)")
  u.add_argument("--runs", type=_positive_int, default=None,
                 help="the multi-run audit instead: train this many times (at least 20), "
                      "one canary in half of them")
  u.add_argument("--confidence", type=float, default=None,
                 help="the lower bounds' confidence (the one-run bound's, or the multi-run "
                      "audit's; default 0.95)")
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


def _profile_command(sub) -> None:
  """`fedjax-dp profile` and its arguments."""
  f = sub.add_parser("profile", help="trace N compiled rounds with jax.profiler and print "
                     "the operations that took the most time")
  _config_args(f)
  f.add_argument("--rounds", type=_positive_int, default=5,
                 help="rounds in the traced chunk (default 5)")
  f.add_argument("--top", type=_positive_int, default=20, help="operations printed (default 20)")
  f.add_argument("--out", help="the trace's folder (new or empty)")
  f.set_defaults(func=_profile)


def _config_command(sub) -> None:
  """`fedjax-dp config` and its arguments."""
  c = sub.add_parser("config", help="list every config key: default, allowed values, meaning")
  c.add_argument("--show", nargs="+", default=[], metavar="KEY",
                 help="one or more keys in full, with the setting that makes each read")
  c.add_argument("--config", help="a YAML config whose plugins' keys are listed too (only "
                                   "its plugins are read)")
  c.add_argument("--set", action="extend", nargs="+", default=[], metavar="plugins=[...]",
                 help="plugins=[FILE or MODULE, ...]: their keys are listed too")
  form = c.add_mutually_exclusive_group()
  form.add_argument("--json", action="store_true", help="as JSON (all keys, or --show's)")
  form.add_argument("--markdown", action="store_true", help="as the docs' Config keys tables")
  c.set_defaults(func=_config)


def _datasets_command(sub) -> None:
  """`fedjax-dp datasets` and its arguments."""
  d = sub.add_parser("datasets", help="list datasets, or show a partition's label histogram")
  d.add_argument("--data-dir", help="folder to search for dataset files")
  d.add_argument("--partition", action="store_true",
                 help="print the per-client label histogram of the configured partition")
  d.add_argument("--config", help="YAML config (dataset, num_clients, partition, alpha, ...; "
                                  "its plugins' datasets are listed too)")
  d.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
  d.add_argument("--plot", metavar="PNG", help="with --partition: also plot the histogram")
  d.add_argument("--write-sample", metavar="NAME",
                 help="write dataset NAME's files in their real format (LEAF JSON, TFF HDF5) "
                      "holding generated examples into --out (femnist, shakespeare, emnist, "
                      "emnist_digits, cifar100, shakespeare_tff, stackoverflow)")
  d.add_argument("--out", help="with --write-sample: a new or empty folder")
  d.add_argument("--clients", type=int, default=20, help="with --write-sample: clients written")
  d.add_argument("--examples", type=float, default=40.0,
                 help="with --write-sample: mean examples a client (FEMNIST's spread)")
  d.set_defaults(func=_datasets)


def _account_command(sub) -> None:
  """`fedjax-dp account` and its arguments: a planned run from its numbers, or from a
  run config (--config / --set), or shuffle amplification."""
  a = sub.add_parser("account", help="epsilon of a planned run (its numbers, or its config), "
                                     "the noise for a target epsilon, or shuffle amplification")
  a.add_argument("kind", nargs="?", choices=["dpsgd", "shuffle"], default="dpsgd",
                 help="dpsgd (default): subsampled Gaussian steps; shuffle: amplification")
  a.add_argument("--config", help="a run config (YAML): q, rounds, the neighbouring relation, "
                                  "the noise multiplier and epsilon as that run is charged")
  a.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="with --config (or alone, on the defaults): override its keys")
  a.add_argument("--q", type=float, help="sampling rate per step, in (0, 1]")
  a.add_argument("--noise-multiplier", type=float, help="Gaussian std / clipping norm")
  a.add_argument("--target-epsilon", type=float, help="print the noise multiplier reaching it")
  a.add_argument("--steps", type=float, help="number of steps (rounds)")
  a.add_argument("--delta", type=float, help="target delta, in (0, 1)")
  a.add_argument("--accountant", choices=["rdp", "pld"], help="rdp (default) or pld")
  a.add_argument("--sampling", choices=["poisson", "fixed"],
                 help="poisson (default: rate q, add/remove one) or fixed (q N of N, replace "
                      "one)")
  a.add_argument("--population", type=float, help="fixed sampling: population size N")
  a.add_argument("--eps0", type=float, help="shuffle: each report's local epsilon")
  a.add_argument("--n", type=float, help="shuffle: number of reports")
  a.add_argument("--json", action="store_true", help="one JSON object")
  a.set_defaults(func=_account)
