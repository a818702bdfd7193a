"""fedjax-dp: a JAX simulator for private, communication-efficient, robust federated learning."""

__version__ = "0.1.0"
