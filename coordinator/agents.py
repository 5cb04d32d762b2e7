"""The MCP route, loaded at its first call.

The MCP SDK is over a third of an idle coordinator's memory (28 of 67 MiB, measured on the
benchmark machine), and many labs have no agent: the SDK is imported, and its session
manager started, when the first agent calls, and stopped with the coordinator.
"""
from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from .errors import APIError
from .limits import read_body, takes_body


@takes_body()  # JSON-RPC messages, 1 MiB at most (uart_exchange sends 64 KiB at most)
class LazyAgents:
    """An ASGI app that builds the MCP app (``mcp_tools.mcp_app``) on the first request."""

    def __init__(self, rules, allowed_hosts: list[str], state: dict):
        self._rules, self._hosts, self._state = rules, allowed_hosts, state
        self._app: ASGIApp | None = None
        self._loading = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._runner: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        try:  # read here, within its limits: the SDK answers a failing read with a 500
            _, receive = await read_body(receive)
        except APIError as exc:
            return await JSONResponse(exc.to_json(), exc.status)(scope, receive, send)
        app = self._app if self._app is not None else await self._loaded()
        await app(scope, receive, send)

    async def _loaded(self) -> ASGIApp:
        async with self._loading:
            if self._app is None:
                self._app = await self._load()
            return self._app

    async def _load(self) -> ASGIApp:
        from .mcp_tools import mcp_app

        app, sessions = mcp_app(self._rules, self._hosts)
        for key, value in self._state.items():  # caller_identity reads these from the app it is asked by
            setattr(app.state, key, value)
        started = asyncio.Event()

        async def serve() -> None:  # the session manager's task group lives in one task
            async with sessions.run():
                started.set()
                await self._stopping.wait()

        self._runner = asyncio.create_task(serve())
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait([self._runner, waiting], return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            waiting.cancel()
            await self._runner  # raises why it could not start
        return app

    async def close(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner
