"""The exporter: one per host; discovers resources, heartbeats, converges services."""
