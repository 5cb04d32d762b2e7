"""How to use a lease's endpoints, as their plugins said (``Endpoint.command`` and ``env``):
the one place the CLI and the MCP route fill the templates."""
from __future__ import annotations

import string


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"  # a placeholder the endpoint has no value for stays as it is


def fill(template: str, endpoint: dict, lease_id: str) -> str:
    fields = _Fields({**(endpoint.get("params") or {}), "host": endpoint["host"], "port": endpoint["port"],
                      "url": endpoint.get("url") or "", "lease": lease_id})
    return string.Formatter().vformat(template, (), fields)


def commands(lease: dict) -> list[str]:
    """Ready-to-run commands for a lease's endpoints (``device-loop forward`` first where the
    endpoints ask for the lease's secret)."""
    out = [f"device-loop forward {lease['id']}"] if lease.get("secret") and lease["endpoints"] else []
    for endpoint in lease["endpoints"]:
        if endpoint.get("command"):
            out.append(fill(endpoint["command"], endpoint, lease["id"]))
    return list(dict.fromkeys(out))


def environment(lease: dict, endpoints: list[dict] | None = None) -> dict[str, str]:
    """The exports that point tools at a lease's endpoints (or at ``endpoints``, e.g. local
    forwards of them)."""
    env: dict[str, str] = {}
    for endpoint in endpoints if endpoints is not None else lease["endpoints"]:
        env |= {name: fill(value, endpoint, lease["id"]) for name, value in (endpoint.get("env") or {}).items()}
    return env


def camera_urls(lease: dict) -> dict | None:
    """The URLs of a lease's camera (the ``video`` plugin's endpoint), or None without one:
    ``page`` (shows the stream), ``stream`` (MJPEG) and ``snapshot`` (a JPEG)."""
    for endpoint in lease["endpoints"]:
        if endpoint["kind"] == "video" and endpoint.get("url"):
            return {"page": endpoint["url"], "stream": endpoint["url"] + endpoint["params"]["stream"],
                    "snapshot": endpoint["url"] + endpoint["params"]["snapshot"]}
    return None


def screen_url(lease: dict) -> str | None:
    """The browser viewer of a lease's screen (the ``vnc`` plugin's ``vnc-web`` endpoint), or None."""
    return next((e.get("url") for e in lease["endpoints"] if e["kind"] == "vnc-web"), None)
