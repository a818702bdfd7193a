"""`fedjax_dp.callbacks`: the public name of fedjax_dp/experiment/callbacks.py (what a
run does after each compiled chunk). The name is that module itself, so that
patching `fedjax_dp.callbacks.X` patches what the runner calls."""

import sys

from fedjax_dp.experiment import callbacks as _callbacks

sys.modules[__name__] = _callbacks
