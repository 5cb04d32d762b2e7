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
        # the reserve waits for the lock meanwhile; a frozen event loop would answer only once
        # the lock is let go, which is after this loop: its GETs would time out (the safety net)
        while time.monotonic() - locked_at < HELD_S or answered < 4:
            for path in ("/health", "/devices"):
                try:
                    response = httpx2.get(f"{coordinator.url}/api/v1{path}", timeout=WAIT_S)
                except httpx2.TimeoutException:
                    pytest.fail(f"GET {path} got no answer while another process held the write lock")
                assert response.status_code == 200, response.text
                answered += 1
        assert not reserved, "the reserve did not wait for the write lock"
    finally:
        holder.communicate("release\n", timeout=WAIT_S)

    reserve.join(WAIT_S)
    (response,) = reserved
    assert response.status_code == 201, response.text
    assert response.json()["device"] == "sim-board-0"
    wait_for(lambda: coordinator.api(f"/leases/{response.json()['id']}").json()["ready"], what="the lease ready")
