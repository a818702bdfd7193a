"""`python -m fedjax_dp.cli`: the `fedjax-dp` command."""

from fedjax_dp.cli import console_main

if __name__ == "__main__":
  console_main()
