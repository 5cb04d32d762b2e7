"""The plugin contract: every hook an exporter plugin may implement.

A plugin is a plain module with ``@hookimpl`` functions (see ``docs/plugins.md``).
The exporter calls each hook *per plugin*: a plugin only ever sees the resources it
discovered itself, so no hook needs to check whose resource it was handed.
"""
import pluggy

PROJECT = "device_loop"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def devloop_available(host):
    """Say whether this host has what the plugin needs (a binary, a kernel interface).

    Return ``None`` when the plugin can run here, or a short reason string when it
    cannot ("ser2net not installed"). The exporter loads only available plugins and
    reports the skipped ones with their reasons. Must be cheap and spawn no process.
    """


@hookspec(firstresult=True)
def devloop_startup(host):
    """Prepare what discovery will look at, once, when the exporter starts.

    Most plugins do not need this. The simulated boards use it to power on their
    consoles. Whatever is created here is torn down in ``devloop_shutdown``.
    """


@hookspec(firstresult=True)
def devloop_shutdown(host):
    """Undo ``devloop_startup`` when the exporter stops."""


@hookspec(firstresult=True)
def devloop_discover(host):
    """Return the resources of this plugin's kind present on this host.

    A list of :class:`device_loop.core.model.Resource`. Read-only: look at sysfs (under
    ``host.sysfs_root``), ``host.configured(...)`` entries and files, never spawn a
    process, never open a device (opening a UART toggles DTR and resets boards).
    Identifiers must be stable across replugs and reboots (USB serial, MAC, ...).
    """


@hookspec(firstresult=True)
def devloop_health(host, resource):
    """Cheap, periodic health check of one resource.

    Return a :class:`device_loop.core.model.Health` (``ok``, ``degraded`` or ``failed``
    with a reason). Must not open the device. Plugins without this hook are ``ok``
    while discovered.
    """


@hookspec(firstresult=True)
def devloop_start(host, resource, lease):
    """Start the service that exposes ``resource`` for ``lease``.

    ``lease`` is a :class:`device_loop.core.model.LeaseRef`. Never choose port numbers:
    ``host.serve_on_free_port(argv, ...)`` starts a program on a pre-bound socket;
    for one that only takes a number, ``host.free_port()``, ``host.processes.spawn(...)``
    and ``proc.wait_listening(...)``. Processes started that way are found again after a
    crash of the exporter. Return a :class:`device_loop.core.model.Service` only once its endpoints
    accept connections; raise :class:`device_loop.core.model.ServiceError` on failure.

    Starts and stops run in worker threads, several at once: a plugin that keeps state
    across resources guards it with a lock. One resource never has two at once: its next
    start waits until its last service is stopped.
    """


@hookspec(firstresult=True)
def devloop_stop(host, service):
    """Stop a service returned by ``devloop_start``.

    Return only when it is really gone: processes reaped, ports free. The default
    (used when a plugin does not implement this hook) stops ``service.processes``.
    """
