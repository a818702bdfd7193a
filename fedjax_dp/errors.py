"""The one-line errors a user sees, in a module that imports nothing of the package,
so that any layer can raise them without importing the layer that owns the topic
(the CLI prints each as one line and exits with status 2)."""


# a Ctrl-C before the command's own modules were loaded (fedjax_dp/__main__.py, cli/)
INTERRUPTED_STARTING = "interrupted while starting: nothing was run or written"


class ConfigError(ValueError):
  """A bad config key or value; the message is one line meant for the user."""


class DataError(ValueError):
  """A missing, truncated or corrupt data file, or a bad data option; one line."""


class RunError(RuntimeError):
  """A user-facing problem with the output folder or a resume; one line."""


class CheckpointError(RuntimeError):
  """No checkpoint in the folder could be restored."""


class AccountError(ValueError):
  """A bad value for `fedjax-dp account`; one line."""
