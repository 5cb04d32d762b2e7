"""Who holds a leased PCI card after its lease (docs/architecture.md, "Lifecycle"), through real
coordinator and exporter processes, the card a fake tree's (this machine has none) and its
node a real character node made for it, of the numbers of a device this machine has (as a
fake tree's node may be, by chance, on a machine with a GPU): a process holding another node of the same device
numbers (one in a /dev of its own, as a container's) is not a holder of the card, and the
card is idle after the lease; one holding the card's own node keeps it reclaiming, and who
it is is shown to admins only: anyone else sees how many."""
import json
import os
import subprocess
import sys

import httpx2
import pytest

from conftest import Coordinator, Exporter, lab_tokens, wait_for
from fake_pci import dev_node, pci_card
from helpers import run_cli
from own_dev import HOLD, held_in_its_own_dev

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
GPU = "0000:01:00.0"
CARD = "gpu-a"
NULL = (1, 3)


def test_only_a_holder_of_the_card_s_own_node_keeps_it_reclaiming_and_only_admins_see_who(tmp_path, env):
    sysfs = tmp_path / "sys"
    pci_card(sysfs, GPU, driver="amdgpu", drm=("renderD128",))
    # (/dev/null's numbers: no driver here opens DRM's, and a test's holder must open the node)
    node = dev_node(sysfs, "/dev/dri/renderD128", *NULL)
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    root = json.loads(run_cli(env, coordinator.url, "admin", "token", "create", "root", "--admin", "--data-dir",
                              str(tmp_path / "coord"), "--json").stdout)["token"]
    admin = {"headers": {"Authorization": f"Bearer {root}"}}
    alice = {"headers": {"Authorization": f"Bearer {tokens['alice']}"}}
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": CARD, "plugin": "pci", "address": GPU}],
                        token_file=str(token_file), sysfs_root=str(sysfs))
    holder = None

    def card(who: dict) -> dict:
        return coordinator.api(f"/devices/{CARD}", **who).json()

    def leased_and_released(during) -> None:
        """A lease of the card by alice, ``during`` it (a process that outlives it), released."""
        lease = coordinator.api("/leases", "POST", json={"device": CARD, "ttl_s": 600}, **alice).json()
        wait_for(lambda: coordinator.api(f"/leases/{lease['id']}", **alice).json()["ready"], what="lease ready")
        during()
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST", **alice).status_code == 200

    try:
        wait_for(lambda: card(admin).get("state") == "idle", what="the card idle")
        # someone's container has a node of the card's numbers in its own /dev, opened during the lease
        with held_in_its_own_dev("/dev/dri/renderD128", *NULL) as other:
            leased_and_released(lambda: None)
            wait_for(lambda: card(admin)["state"] == "idle", what="the card idle after its lease")
            assert card(admin)["busy_by"] == [] and other.poll() is None, "another node is not the card's"

        def hold_the_card() -> None:
            nonlocal holder
            holder = subprocess.Popen([sys.executable, "-c", HOLD, str(node)], stdout=subprocess.PIPE,
                                      start_new_session=True)
            assert holder.stdout.readline() == b"held\n"
        leased_and_released(hold_the_card)
        program = os.path.basename(sys.executable)
        shown = wait_for(lambda: (lambda d: d if d["state"] == "reclaiming" and d["busy_by"] else None)(card(admin)),
                         what="the holder of the card's own node reported")
        assert [(h["pid"], h["program"]) for h in shown["busy_by"]] == [(holder.pid, program)]
        assert shown["busy_count"] == 1 and f"pid {holder.pid} ({program})" in shown["reason"]

        public = coordinator.api(f"/devices/{CARD}", **alice)
        said = public.json()
        assert (said["state"], said["busy_count"]) == ("reclaiming", 1) and "busy_by" not in said
        assert said["reason"].startswith("still held after its lease by 1 process (an admin sees which on its page)")
        listed = coordinator.api("/devices", **alice)
        assert f'"pid": {holder.pid}' not in public.text + listed.text and program not in public.text + listed.text
        page = httpx2.get(f"{coordinator.url}/devices/{CARD}", timeout=10, **alice).text
        assert "1 process: an admin sees which on this page" in page and f"pid {holder.pid}" not in page
        page = httpx2.get(f"{coordinator.url}/devices/{CARD}", timeout=10, **admin).text
        assert f"pid {holder.pid} <b>{program}</b>" in page

        holder.kill()
        holder.wait()
        wait_for(lambda: card(admin)["state"] == "idle", what="the card idle once its holder ended")
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        exporter.stop()
        coordinator.stop()
