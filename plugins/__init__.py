"""Built-in exporter plugins, one per resource kind (see ``docs/plugins.md``)."""
