"""Hot primitives, each with a plain reference and faster variants behind one signature.

Installed as `fedjax_dp.kernels`.
"""
