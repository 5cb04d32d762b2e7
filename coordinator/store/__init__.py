"""All SQL of the coordinator. Rules live in the rule modules, not here.

``core.py`` is the shared core (``Store``: the connection, the two drivers of
``drivers.py``, transactions, the dialect switches, statement counting, migrations); each
other module holds the statements of one service's tables (``HostQueries``,
``DeviceQueries``, ``LeaseQueries``, ...), and is handed, in ``rules.py``, only to the
services that own those tables or are lent them
(docs/architecture.md, "A service reaches only its tables").
"""
from .core import Store, UniqueViolation
from .outage import DatabaseUnavailable

__all__ = ["DatabaseUnavailable", "Store", "UniqueViolation"]
