"""The simulation itself: state, the compiled round, hyperparameters as data."""
