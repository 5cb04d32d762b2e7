"""The exporter's link to its coordinator: heartbeats out, desired state back.

Each call answers with the desired state to converge to, or None to leave everything as
it is (the coordinator is unreachable). A refused heartbeat still yields a desired state:
the one the coordinator holds, or nothing at all if a newer exporter took this name.
"""
from __future__ import annotations

import logging
from typing import Iterator

import httpx2

from device_loop.core import API_PREFIX
from device_loop.core.model import OperationError
from device_loop.core.protocol import DesiredState, Heartbeat
from device_loop.core.tokens import load_token

log = logging.getLogger("device_loop.exporter")
# a newer start of this exporter took its name: serve nothing while it has it
SUPERSEDED = DesiredState()


class CoordinatorLink:
    def __init__(self, url: str, host_name: str, token_file=None, timeout: float = 10.0):
        token = load_token(token_file)
        self.authenticated = bool(token)
        self.url, self.host_name = url, host_name
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = self._client(timeout)
        self._path = f"{API_PREFIX}/hosts/{host_name}"
        self._last_refusal: str | None = None  # said once, not at every heartbeat
        self.accepted = False  # whether the last heartbeat was taken (answered 200)

    def _client(self, timeout) -> httpx2.Client:
        # a TLS context takes 30 ms to build (each image fetch has a client of its own): only for https
        return httpx2.Client(base_url=self.url, timeout=timeout, headers=self._headers,
                             verify=self.url.startswith("https://"))

    def heartbeat(self, report: Heartbeat) -> DesiredState | None:
        self.accepted = False
        try:
            response = self._http.post(f"{self._path}/heartbeat", content=report.model_dump_json(by_alias=True),
                                       headers={"Content-Type": "application/json"})
            answer = response.json()
        except (httpx2.HTTPError, ValueError) as exc:
            log.warning("coordinator unreachable (%s); services keep running as they are", exc)
            return None
        if response.status_code == 200:
            self.accepted = True
            if self._last_refusal:
                log.info("heartbeats are accepted again")
            self._last_refusal = None
            return DesiredState.model_validate(answer)
        refusal = f"heartbeat refused ({response.status_code}): {answer.get('message', answer)}"
        if refusal != self._last_refusal:
            quietly = "; retrying every heartbeat period, quietly" if response.status_code < 500 else ""
            log.error("%s%s", refusal, quietly)
        self._last_refusal = refusal
        if answer.get("error") == "superseded_boot":
            return SUPERSEDED
        if 400 <= response.status_code < 500:
            return self._desired(self._http, {})
        return None

    def wait_desired(self, client: httpx2.Client, etag: str | None, wait_s: float,
                     boot_id: str) -> DesiredState | None:
        """Long-poll: the desired state once its etag is not ``etag`` (or ``wait_s`` passed).
        ``boot_id``: if this poll is cut, the coordinator takes this boot for dead until its
        next heartbeat."""
        return self._desired(client, {"etag": etag or "", "wait": wait_s, "boot": boot_id})

    def long_poll_client(self, wait_s: float) -> httpx2.Client:
        """A client of its own for the long-poll thread, with room for the wait."""
        return self._client(wait_s + 10)

    def _desired(self, client: httpx2.Client, params: dict) -> DesiredState | None:
        try:
            response = client.get(f"{self._path}/desired", params=params)
            return DesiredState.model_validate(response.json()) if response.status_code == 200 else None
        except (httpx2.HTTPError, ValueError):
            return None

    def fetch_image(self, sha256: str) -> Iterator[bytes]:
        """The bytes of an image a flash on this host writes, streamed from the registry."""
        timeout = httpx2.Timeout(30.0, read=120.0)
        try:
            with self._client(timeout) as client, \
                    client.stream("GET", f"{self._path}/images/{sha256}") as response:
                if response.status_code != 200:
                    response.read()
                    try:
                        why = response.json().get("message", response.text)
                    except ValueError:
                        why = response.text[:200]
                    raise OperationError(f"cannot fetch image {sha256} ({response.status_code}): {why}", changed=False)
                # pieces as they arrive: re-cutting them to a fixed size costs httpx2 3x the transfer
                yield from response.iter_bytes()
        except httpx2.HTTPError as exc:
            raise OperationError(f"cannot fetch image {sha256} from {self.url}: {exc}", changed=False) from None

    def close(self) -> None:
        self._http.close()
