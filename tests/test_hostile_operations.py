"""The operations route against hostile callers (docs/architecture.md, "Operations"): another
user's lease, arguments a kind does not take, too many, too long or nested ones, a kind no
resource runs: each a clear 4xx, and nothing reaches the exporter."""
import pytest

from lab_in_process import FakeExporter, device, in_process_lab
from device_loop.core.protocol import MAX_ARG_CHARS, MAX_ARGS, OperationKindReport, ResourceReport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]


def bench(name: str = "b0") -> dict:
    """A board whose second resource runs ``count`` (one argument, ``to``) and serves no lease."""
    report = device(name)
    report["resources"].append(ResourceReport(
        kind="bench", plugin="steps", identifier=f"steps:{name}", service=False,
        operations=[OperationKindReport(kind="count", args={"to": "steps"}, exclusive=False)]).model_dump())
    return report


async def test_what_an_operation_may_not_be_is_refused_and_nothing_is_queued(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        exporter = FakeExporter(alice, "host-a")
        assert (await exporter.beat([bench()])).status_code == 200
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        start = f"/leases/{lease['id']}/operations"

        taken = await bob.post(start, json={"kind": "count", "args": {"to": 3}})
        assert taken.status_code == 404 and "alice" not in taken.text, "another's lease is no lease of bob's"
        refused = {
            "an argument it does not take": ({"kind": "count", "args": {"secs": 3}}, 422, "count takes to (steps)"),
            "too many": ({"kind": "count", "args": {f"a{i}": 1 for i in range(MAX_ARGS + 1)}}, 422, "args"),
            "a value too long": ({"kind": "count", "args": {"to": "9" * (MAX_ARG_CHARS + 1)}}, 422, "args"),
            "a nested value": ({"kind": "count", "args": {"to": {"deeper": [1]}}}, 422, "args"),
            "a name that is no word": ({"kind": "count", "args": {"To; DROP": 1}}, 422, "args"),
            "a kind no resource runs": ({"kind": "reboot", "args": {}}, 409, "runs no operation 'reboot'"),
            "a kind that is no word": ({"kind": "../../x", "args": {}}, 422, "kind"),
            "a body of another type": ("kind=count", 415, ""),
        }
        for what, (body, status, said) in refused.items():
            sent = await (alice.post(start, content=body, headers={"Content-Type": "text/plain"})
                          if isinstance(body, str) else alice.post(start, json=body))
            assert sent.status_code == status and said in sent.json()["message"], (what, sent.text)
        assert (await alice.get("/devices/b0/operations")).json() == [], "nothing was queued"
        desired = (await exporter.beat([bench()])).json()
        assert desired["operations"] == [], "nothing reaches the exporter"
        ok = await alice.post(start, json={"kind": "count", "args": {"to": 3}})
        assert ok.status_code == 201 and ok.json()["args"] == {"to": 3}, ok.text
