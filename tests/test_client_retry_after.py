"""The client waits out a share's "not yet" (docs/architecture.md, "Shares of one lab"): a 429
with a short Retry-After is tried again after it, with the same Idempotency-Key; a long one,
or none, is the caller's to decide (raised)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from device_loop.client.http import MAX_RETRY_AFTER_S, Coordinator, CoordinatorError

pytestmark = pytest.mark.timeout(30)


def serve(answers: list[tuple[int, str | None]]):
    """A server on a free loopback port answering ``answers`` in turn, noting each request's key and time."""
    seen: list[tuple[str | None, float]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append((self.headers.get("Idempotency-Key"), time.monotonic()))
            status, retry_after = answers[min(len(seen), len(answers)) - 1]
            body = json.dumps({"error": "too_many_operations", "message": "not yet"} if status == 429 else
                              {"id": "op-1"}).encode()
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.mark.parametrize("answers, ok", [([(429, "1"), (201, None)], True),
                                         ([(429, str(int(MAX_RETRY_AFTER_S) + 1)), (201, None)], False),
                                         ([(429, None), (201, None)], False),
                                         ([(429, "soon"), (201, None)], False)])
def test_a_429_is_waited_out_only_when_it_says_a_short_while(answers, ok):
    server, seen = serve(answers)
    try:
        api = Coordinator(f"http://127.0.0.1:{server.server_port}", user="alice", token="dl_x")
        if ok:
            assert api.post("/leases/l/settle") == {"id": "op-1"}
            (first_key, first_at), (again_key, again_at) = seen
            assert first_key == again_key, "the repeat is the same request: its Idempotency-Key too"
            assert again_at - first_at >= 1.0, "it waited what Retry-After said"
        else:
            with pytest.raises(CoordinatorError) as refused:
                api.post("/leases/l/settle")
            assert refused.value.status == 429 and len(seen) == 1
    finally:
        server.shutdown()
