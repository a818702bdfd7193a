"""Sweeps: many runs of one experiment, as replicas of as few compiled programs as can be.

  spec.py      the sweep file: base config, grid, variants, seeds -> cells
  replicas.py  runs sharing one compiled program, one after the other or vmapped
  run.py       run_sweep: programs, resumption, the sweep folder
  table.py     the tidy table (CSV, Parquet), means over seeds and their plots

`fedjax_dp.sweep(...)` (api.py) and `fedjax-dp sweep FILE --out DIR` run them.
"""

from fedjax_dp.sweeps.spec import Cell, SweepSpec, load_sweep
from fedjax_dp.sweeps.run import run_sweep

__all__ = ["Cell", "SweepSpec", "load_sweep", "run_sweep"]
