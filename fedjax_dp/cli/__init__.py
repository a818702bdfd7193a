"""`fedjax-dp` command line: `run`, `sweep`, `compare`, `profile`, `config`, `datasets`,
`account`.

Every user error (bad config key or value, missing or corrupt data, an output
folder that would be overwritten) prints one line `error: ...` to stderr and
exits with status 2, without a traceback and without touching earlier results.
A run that diverged (its model or test metrics not finite) stops there, keeps its
outputs and exits with status 3 after one line; Ctrl-C exits with 130.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
import warnings

from fedjax_dp.cli.commands import _INTERRUPTED_RUN, final_line, interrupted_line  # noqa: F401
from fedjax_dp.cli.parser import OneLineParser, build_parser  # noqa: F401  (public here)
from fedjax_dp.experiment import interrupts

USER_ERROR = 2
INTERRUPTED = 130


def run_guarded(fn) -> int:
  """fn() -> exit status, with the command line's handling of user errors (one
  line `error: ...` on stderr, status 2) and of Ctrl-C ('interrupted', 130).
  Also used by the experiment scripts."""
  from fedjax_dp.errors import AccountError, CheckpointError, ConfigError, DataError, RunError
  try:
    with interrupts.installed():   # a Ctrl-C is never lost (interrupts.py)
      code = fn()
      interrupts.check()   # one deferred while a module loaded, if nothing checked it since
      return code
  except (ConfigError, DataError, RunError, CheckpointError, AccountError) as e:
    print(f"error: {e}", file=sys.stderr)
    return USER_ERROR
  except (KeyboardInterrupt, Exception) as e:
    # a Ctrl-C, or an error a library's cleanup raised while a Ctrl-C unwound through it
    # (seen once: orbax, cut short mid-save): the Ctrl-C is what happened
    if not _raised_by_an_interrupt(e):
      raise
    _free_quietly(e)
    # the process ends here: coroutines freed at its exit stay quiet too
    warnings.filterwarnings("ignore", message=interrupts.NEVER_AWAITED, category=RuntimeWarning)
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
  """The `fedjax-dp` command (fedjax_dp/__main__.py guards the imports before it)."""
  try:
    code = main()
    sys.stdout.flush()
  except KeyboardInterrupt:   # before run_guarded: parsing, or JAX's own start-up
    from fedjax_dp.errors import INTERRUPTED_STARTING
    print(INTERRUPTED_STARTING, file=sys.stderr)
    code = INTERRUPTED
  except BrokenPipeError:
    # the reader went away (`fedjax-dp run --print-config | head`): no traceback, and
    # stdout pointed at devnull so that the interpreter's own flush at exit is quiet too
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
  exit_with(code)
