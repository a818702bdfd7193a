"""Running experiments: the run loop, command line, checkpoints, output files."""
