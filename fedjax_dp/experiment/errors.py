"""RunError: the one-line error of a run's output folder, resume or privacy budget."""


class RunError(RuntimeError):
  """A user-facing problem with the output folder or a resume; one line."""
