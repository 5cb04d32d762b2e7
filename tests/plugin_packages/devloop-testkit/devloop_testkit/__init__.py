"""Plugins for the exporter's tests, pip-installed into a folder of their own and loaded
through the ``device_loop`` entry points like any third-party plugin (tests/exporter_testkit.py)."""
