"""The ``device-loop`` command: client commands plus ``up``, ``coordinator``, ``exporter``."""
