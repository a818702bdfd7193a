"""`python -m fedjax_dp` and the `fedjax-dp` command (pyproject's console script).

The command's own modules (and JAX) are imported inside `console_main`, so that a
Ctrl-C while they load is one line and status 130, as it is later, never an import
traceback (the first-hour review, finding 5)."""

import sys

from fedjax_dp.errors import INTERRUPTED_STARTING


def console_main() -> None:
  try:
    from fedjax_dp.cli import console_main as command
  except KeyboardInterrupt:
    print(INTERRUPTED_STARTING, file=sys.stderr)
    sys.exit(130)
  command()


if __name__ == "__main__":
  console_main()
