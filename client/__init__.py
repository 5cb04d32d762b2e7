"""The Python client library of the coordinator (``Lab``); the ``device-loop`` commands built
on it are ``cli/``'s (this package imports no click: an import contract in pyproject.toml)."""
from .lab import Lab, Lease, LeaseFailed

__all__ = ["Lab", "Lease", "LeaseFailed"]
