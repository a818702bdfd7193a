"""argparse types for the benchmark scripts' counts: a bad value is refused in
one line by argparse (exit 2), never a traceback halfway through a run."""

from __future__ import annotations

import argparse


def _int_at_least(text: str, low: int) -> int:
  try:
    value = int(text)
  except ValueError:
    value = low - 1
  if value < low:
    raise argparse.ArgumentTypeError(f"{text!r}: allowed are whole numbers >= {low}")
  return value


def positive_int(text: str) -> int:
  """An int >= 1."""
  return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
  """An int >= 0."""
  return _int_at_least(text, 0)


def positive_float(text: str) -> float:
  """A finite float > 0."""
  try:
    value = float(text)
  except ValueError:
    value = float("nan")
  if not (value > 0 and value != float("inf")):
    raise argparse.ArgumentTypeError(f"{text!r}: allowed are finite numbers > 0")
  return value


def new_file(text: str) -> str:
  """A path where no file is yet (--json, --plot): results are never overwritten,
  and the refusal comes before the benchmark runs."""
  import os
  if os.path.exists(text):
    raise argparse.ArgumentTypeError(f"{text!r} exists; name a new file")
  return text


def write_results(result, path: str, indent: int = 2) -> None:
  """Writes `result` as JSON to `path` (a new_file; its folder is made), never over a file."""
  import json
  import os
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "x") as f:
    json.dump(result, f, indent=indent)
