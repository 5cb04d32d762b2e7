"""Another process holding the SQLite write lock (``device-loop admin ... --data-dir`` on a
live lab) freezes neither requests nor long-polls: the coordinator waits for the lock off
its event loop."""
import subprocess
import sys
import threading
import time

import httpx2
import pytest

from conftest import WAIT_S, wait_for
from helpers import wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

# Takes the write lock, says so, and keeps it until told (a line on stdin).
HOLD_THE_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""
HELD_S = 3.0


def test_requests_are_answered_while_another_process_holds_the_write_lock(tmp_path, coordinator, exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_WRITE_LOCK, str(tmp_path / "coord" / "coordinator.sqlite")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        locked_at = time.monotonic()
        reserved = []
        reserve = threading.Thread(target=lambda: reserved.append(httpx2.post(
            f"{coordinator.url}/api/v1/leases", json={"device": "sim-board-0", "ttl_s": 600},
            headers={"X-Device-Loop-User": "alice"}, timeout=30)), daemon=True)
        reserve.start()

        answered = 0
        while time.monotonic() - locked_at < HELD_S:  # the reserve waits for the lock meanwhile
            for path in ("/health", "/devices"):
                began = time.monotonic()
                try:
                    response = httpx2.get(f"{coordinator.url}/api/v1{path}", timeout=HELD_S / 2)
                except httpx2.TimeoutException:
                    pytest.fail(f"GET {path} got no answer while another process held the write lock")
                assert response.status_code == 200, response.text
                # a frozen event loop answers only once the lock is let go
                assert time.monotonic() - began < HELD_S / 2, f"GET {path} took {time.monotonic() - began:.2f} s"
                answered += 1
        assert answered >= 10 and not reserved, "the reserve did not wait for the write lock"
    finally:
        holder.communicate("release\n", timeout=WAIT_S)

    reserve.join(WAIT_S)
    (response,) = reserved
    assert response.status_code == 201, response.text
    assert response.json()["device"] == "sim-board-0"
    wait_for(lambda: coordinator.api(f"/leases/{response.json()['id']}").json()["ready"], what="the lease ready")
