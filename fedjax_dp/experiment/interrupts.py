"""Ctrl-C that a run never loses.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread is. Raised
inside a gc callback (JAX registers one) or a `__del__`, it is swallowed: Python
prints 'Exception ignored in ...' and carries on, and the run went on to its last
round and exited 0 after the user's Ctrl-C (seen in the CLI's Ctrl-C test). Within
`installed()`, SIGINT is recorded, and raised as Python's own handler raises it
except inside those two or, for a first Ctrl-C, inside an import; `check()` (the run
calls it after set-up, before compiling and between chunks; the command line when a
command returns) raises a recorded one that has not ended the run, so a swallowed or
deferred Ctrl-C ends it there.

From a Ctrl-C until `installed()` exits, teardown's complaints are silenced: an
orbax save cut short frees coroutines it never awaited and threads that fail as
its manager shuts down, and Python printed those ('never awaited', 'Exception
ignored') before the CLI's one line 'interrupted' (seen in CI).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
import warnings

_requested = False
NEVER_AWAITED = r"coroutine .* was never awaited"


def _would_be_swallowed(frame) -> bool:
  """Is the main thread inside a gc callback or a __del__ (on the stack from `frame`)?"""
  callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
      return True
    frame = frame.f_back
  return False


def quiet_teardown() -> None:
  """Silences what an interrupted library's teardown prints, until `installed()`
  exits (or for the process, outside it). Called as the KeyboardInterrupt is
  raised: a Ctrl-C recorded in a gc callback is not yet ending the run."""
  warnings.filterwarnings("ignore", message=NEVER_AWAITED, category=RuntimeWarning)
  sys.unraisablehook = lambda unraisable: None


def _importing(frame) -> bool:
  """Is the main thread importing a module (on the stack from `frame`)? A
  KeyboardInterrupt raised there, inside a C extension's initialisation (XLA's),
  aborted the process (SIGABRT, once a SIGSEGV) instead of ending it in one line."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      return True
    frame = frame.f_back
  return False


def _on_sigint(signum, frame):
  global _requested
  first = not _requested
  _requested = True
  if _would_be_swallowed(frame) or (first and _importing(frame)):
    return   # recorded: check() raises it at the next safe point (a second Ctrl-C: now)
  quiet_teardown()
  raise KeyboardInterrupt


@contextlib.contextmanager
def installed():
  """SIGINT through _on_sigint within, where Python's own handler is in place and
  this is the main thread (a SIGINT ignored by the parent stays ignored)."""
  global _requested
  if threading.current_thread() is not threading.main_thread() or \
      signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    yield
    return
  _requested = False
  previous = signal.signal(signal.SIGINT, _on_sigint)
  hook = sys.unraisablehook
  try:
    with warnings.catch_warnings():   # restores the filters quiet_teardown adds
      yield
  finally:
    signal.signal(signal.SIGINT, previous)
    sys.unraisablehook = hook
    _requested = False


def check() -> None:
  """Raises KeyboardInterrupt if a Ctrl-C was recorded (one a library swallowed)."""
  if _requested:
    quiet_teardown()
    raise KeyboardInterrupt
