"""Clients of the coordinator: the Python library (``Lab``) and the ``device-loop`` CLI."""
from .lab import Lab, Lease, LeaseFailed

__all__ = ["Lab", "Lease", "LeaseFailed"]
