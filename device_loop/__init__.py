"""device-loop: lease a lab's boards and phones by name, reach them directly, give them back.

Plugins import ``device_loop.plugin``, the public plugin API, and nothing else of ours.
"""
