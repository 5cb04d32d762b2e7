"""One ser2net 4.x process per leased UART: telnet with RFC 2217, and raw TCP if asked."""
from __future__ import annotations

from device_loop.plugin import CONSOLE_COMMAND, Endpoint, EndpointRole, Service, ServiceError

ATTEMPTS = 3
FAILED = ("Address already in use", "Unable to startup network port", "invalid")


def _connection(name: str, accepter: str, device: str, baud: int, framing: str) -> str:
    """One ser2net connection. ``chardelay: false``: ser2net otherwise holds characters
    back to batch them, which took a 16-byte round trip from 0.3 ms to 3.5 ms
    (bench/uart_throughput.py) at no gain in throughput."""
    bits, parity, stop = tuple(framing)  # ser2net spells 8N1 as n81
    return (f"connection: &{name}\n"
            f"  accepter: {accepter}\n"
            f"  connector: serialdev,{device},{baud}{parity.lower()}{bits}{stop},local\n"
            f"  options:\n"
            f"    kickolduser: true\n"
            f"    chardelay: false\n")


def start_ser2net(host, resource, lease, ser2net: str, device: str, baud: int, framing: str, raw: bool) -> Service:
    """Start ser2net and return once it listens on every port (or, behind a gate, every unix
    socket: ``host.private_socket``) we gave it.

    ser2net takes port numbers, not sockets, so another process can take a port between
    our pick and its bind. It then says so and keeps running (ignoring the first
    SIGTERM): watch for that, stop it, and try other ports.
    """
    folder = host.state_dir / "ser2net"
    folder.mkdir(parents=True, exist_ok=True)
    protocols = ["rfc2217", "raw"] if raw else ["rfc2217"]
    for _ in range(ATTEMPTS):
        private = {p: host.private_socket(f"ser2net-{p}") for p in protocols}
        ports = {p: 0 if private[p] else host.free_port() for p in protocols}
        where = {p: f"unix,{private[p]}" if private[p] else f"tcp,{host.bind_address},{ports[p]}" for p in protocols}
        accepters = {"rfc2217": f"telnet(rfc2217),{where['rfc2217']}", "raw": where.get("raw", "")}
        config = folder / f"{lease.id}-{resource.device}.yaml"
        config.write_text("".join(_connection(f"c_{p}", accepters[p], device, baud, framing) for p in protocols))
        proc = host.processes.spawn([ser2net, "-n", "-d", "-u", "-c", str(config)],
                                    name=f"ser2net-{resource.device}-{lease.id}", lease=lease.id)
        problem = proc.wait_listening({port for port in ports.values() if port}, failure_signs=FAILED,
                                      paths={path for path in private.values() if path})
        if problem is None:
            params: dict[str, str | int] = {"baud": baud, "framing": framing}
            return Service(endpoints=[Endpoint(resource.kind, host.advertise_address, ports[p], protocol=p,
                                               params=params, command=CONSOLE_COMMAND, role=EndpointRole.CONSOLE,
                                               path=private[p])
                                      for p in protocols], processes=[proc])
        proc.stop(grace=0.5)  # a ser2net that failed to bind ignores the first SIGTERM anyway
        if "invalid" in problem:
            break  # another port will not help
    raise ServiceError(f"ser2net did not start: {problem}")
