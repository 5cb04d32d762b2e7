"""The OpenAPI description (GET /api/v1/openapi.json) is valid and lists every route of the
table, each with every status its code can answer (read from the code: raised_statuses.py),
and schemathesis, run against a coordinator's app on a small lab, finds no 5xx and no answer
the description does not allow.

schemathesis runs as its command does (``schemathesis run``: its pytest integration does not
work with pytest 9.2), in this process against the app (schemathesis_in_process.py), with
this file's hooks: see ``before_call``.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import re
from pathlib import Path

import pytest
import requests
import schemathesis
from click.testing import CliRunner
from jsonschema import Draft202012Validator

import schemathesis_in_process
from device_loop.cli.main import cli
from device_loop.coordinator.api import ROUTES, _guarded, path_names, route_handler
from device_loop.coordinator.app import create_app
from device_loop.coordinator.calls import BY_NAME, CALLS
from device_loop.coordinator.idempotency import MAX_KEY_CHARS
from device_loop.coordinator.limits import _Reader
from device_loop.coordinator.openapi import document, documented, openapi_path
from device_loop.coordinator.rules import Settings
from device_loop.coordinator.schemas import MAX_WAIT_S, aliases
from device_loop.coordinator.serve import sqlite_url
from device_loop.core import API_PREFIX, PROTOCOL_VERSION
from device_loop.core.protocol import CandidateReport, DeviceReport, Heartbeat, ResourceReport
from lab_in_process import FakeExporter, device, flash_target, in_process_lab
from raised_statuses import reach

pytestmark = pytest.mark.service

JSON = {"Content-Type": "application/json"}
# every check of schemathesis runs ("all"), conformance to the document included
# (positive_data_acceptance: a request the document allows is not refused as malformed)
NOT_IN_THE_TRUST_MODE = ["ignored_auth"]  # no route needs credentials there
# Schema-valid requests the rules refuse (422) for what no JSON Schema can say. What one can
# say, the document says (openapi.CHECKED: a device or a class and/or tags to reserve, run or
# an A/B pair, a fallback with needs any, a matrix's groups, off_time_s with a cycle, a flash's
# image, an image's ref, an address, keys that follow their pattern...), and a name that names
# nothing is a 404, a name several images have a 409, as the document says of them. What is
# left, by operation:
REFUSED_WHEN_STATE_SAYS = {
    "heartbeat": "a device name or a resource identifier repeated in a report (no keyword says an item's field is "
                 "unique); a device node's mode that is world-writable (no keyword tests a bit of a number)",
    "upload_image": "bytes that are not the size or the sha256 the query declared",
    "start_operation": "the arguments of a kind the device's plugins declare (a flash's, the coordinator's own, the "
                       "document says)",
    "submit_job": "a metric's regex that Python or RE2 does not read (the document says it has a group named value)",
    "reserve_for_job": "a cell its job's spec does not have (and as reserve's, below)",
    "report_cell": "a cell its job's spec does not have",
    "report_run": "a cell or an attempt its job's spec does not have",
    "create_token": "a scope's class no device has, or an operation nothing here runs: the lab judges them "
                    "(docs/architecture.md, \"Shares of one lab\")",
    "set_token": "as create_token's, of its fields merged with the token's scope; a scope for an admin's token",
    # (a value named in the test's dictionaries, or by an earlier answer, is written into a body
    # generated without it, a device into one with a class: a request the document does not
    # allow, which schemathesis still counts as one it does)
    "reserve": "none of its own",
}
# negative_data_rejection's own list, and 413: data too large to be valid is refused for its size first
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # positive_data_acceptance's own list


def test_the_document_is_valid_and_lists_every_route():
    described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS)
    for trust_mode in (False, True):
        valid = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, 86400, single_user=trust_mode)
        schemathesis.openapi.from_dict(valid).validate()  # against the OpenAPI 3.1 schema
        for schema in valid["components"]["schemas"].values():
            Draft202012Validator.check_schema(schema)
        refs = set(re.findall(r'"\$ref": "#/([^"]+)"', json.dumps(valid)))
        for ref in refs:  # (the OpenAPI schema does not check that a reference names something)
            place = valid
            for step in ref.split("/"):
                assert step in place, f"#/{ref} names nothing in the document"
                place = place[step]
    operations = [(method.upper(), path) for path, ops in described["paths"].items() for method in ops]
    assert sorted(operations) == sorted((c.method, openapi_path(c.route)) for c in documented(CALLS))
    left_out = {row[:2] for row in ROUTES} - {(c.method, c.route) for c in documented(CALLS)}
    assert left_out == {("GET", "/api/v1/openapi.json"), ("GET", "/api/v1/events"), ("GET", "/metrics"),
                        ("GET", "/"), ("GET", "/devices/{name}"), ("POST", "/login"), ("POST", "/logout"),
                        ("GET", "/static/{file}")}, "only what is no call of the table's"


def test_every_argument_of_a_call_is_described_where_its_route_takes_it():
    """A GET takes its arguments in the query, a POST in its JSON body (the heartbeat and the
    upload: their own bodies, their arguments in the query), all under their REST names."""
    described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS)
    schemas = described["components"]["schemas"]
    for call in documented(CALLS):
        operation = described["paths"][openapi_path(call.route)][call.method.lower()]
        names = set(aliases(call.args).values()) - path_names(call)
        query = {p["name"] for p in operation["parameters"] if p["in"] == "query"}
        assert {p["name"] for p in operation["parameters"] if p["in"] == "path"} == path_names(call), call.name
        if call.method == "GET" or call.body is not None or call.streamed:
            assert query == names, call.name
        else:
            assert query == set(), call.name
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            properties = schemas[body["$ref"].rsplit("/", 1)[1]]["properties"] if names else {}
            assert set(properties) == names, call.name


def around_the_call(call, single_user: bool) -> set[int]:
    """What a route can answer besides what its call's code does, from how a request reaches
    it: a NUL in its URL (api.py), a page of another origin, a Host it is not reached by
    (origin.py); with tokens, one refused, on any route it is sent to, and looked up in the
    database (identity.py); a body's pace and size (limits.py), what its model refuses, its
    type where it is JSON (api.py); an Idempotency-Key too long or used before (idempotency.py)."""
    statuses = {400, 403, 421} | (set() if single_user else {401, 503})
    if call.method == "POST":
        statuses |= {408, 413, 422} | (set() if call.streamed else {415})
    return statuses


# Where the reading of the code (raised_statuses.py, which does not tell branches apart) finds
# more than a route can answer: a lease's share of operations (429) is spent by an operation
# started in a lease (Operations._start), never by a step between leases (a heartbeat's) nor by
# an admin's on a device nobody holds.
NOT_FROM_THIS_ROUTE = {"heartbeat": {429}, "recover_unleased": {429}, "power_unleased": {429}}


def listed(described: dict, call) -> set[int]:
    """The refusals the document lists for ``call``'s route."""
    operation = described["paths"][openapi_path(call.route)][call.method.lower()]
    return {int(status) for status, answer in operation["responses"].items() if "$ref" in answer}


def test_each_route_lists_every_status_its_code_can_answer():
    """What a call's code raises (read from it), what its database answers while it is out of
    reach (503), and what every request meets on its way, each route lists; and what the table
    says of a call beyond its shape is what its code does."""
    framework = reach(route_handler, _guarded, _Reader.receive)
    post = next(c for c in CALLS if c.method == "POST" and c.idempotent and not c.streamed)
    assert framework.statuses <= around_the_call(post, False), "a refusal on the way to a call the test lacks"
    codes = {call.name: reach(call.run, call.ready) for call in documented(CALLS)}
    for call in documented(CALLS):
        code = codes[call.name]
        assert call.database == code.store, f"{call.name} reads the database: {code.store}"
        assert call.refusals <= code.statuses, f"{call.name} lists what its code never answers"
    for single_user in (False, True):
        described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, 86400, single_user=single_user)
        for call in documented(CALLS):
            code = codes[call.name]
            answers = (code.statuses - NOT_FROM_THIS_ROUTE.get(call.name, set())) | ({503} if code.store else set())
            missing = (answers | around_the_call(call, single_user)) - listed(described, call)
            assert not missing, f"{call.name} ({call.method} {call.path}) does not list {sorted(missing)}"
    described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, 86400, single_user=True)
    assert {409, 503} <= listed(described, BY_NAME["image_info"]), "a name several images have: ambiguous_image"
    assert 503 not in listed(described, BY_NAME["health"]), "the trust mode's /health reads no database"
    assert all(503 in listed(described, call) for call in documented(CALLS) if call.name != "health")


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_what_schemathesis_found_is_refused_with_a_4xx(tmp_path):
    async with in_process_lab(tmp_path) as (client, _, _):
        api = client()
        # PostgreSQL's text holds no NUL character: it was a 500 there
        assert (await api.post("/leases", json={"device": "b\x00"})).json()["error"] == "invalid"
        assert (await api.get("/devices/b%00")).json()["error"] == "bad_request"
        assert (await api.get("/images", params={"device": "\x00"})).json()["error"] == "bad_request"
        # a number, not true: it was taken for 1 day
        gc = await api.post("/admin/images/gc", json={"unused_days": True})
        assert gc.status_code == 422 and "number" in gc.json()["message"]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_the_document_says_what_the_api_refuses_and_takes(tmp_path):
    described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, 7 * 86400, single_user=True)
    reserve = described["paths"]["/api/v1/leases"]["post"]
    assert {"400", "403", "404", "408", "409", "413", "415", "421", "422"} <= set(reserve["responses"])
    assert not any(status.endswith("XX") for path in described["paths"].values() for operation in path.values()
                   for status in operation["responses"]), "each refusal named, none left to a range"
    name = described["paths"]["/api/v1/devices/{name}"]["get"]["parameters"][0]["schema"]
    assert re.search(name["pattern"], "b0") and not re.search(name["pattern"], "b\x00")
    user = next(p for p in reserve["parameters"] if p["name"] == "X-Device-Loop-User")["schema"]["pattern"]
    assert re.search(user, "alice") and not re.search(user, "a b") and not re.search(user, "Coordinator")
    ttl = described["components"]["schemas"]["ReserveIn"]["properties"]["ttl_s"]["anyOf"][0]
    assert (ttl["minimum"], ttl["maximum"]) == (1, 7 * 86400), "this lab's longest lease"
    async with in_process_lab(tmp_path) as (client, _, _):
        api = client()
        exporter = FakeExporter(api, "host-a")
        beat = {**exporter.report([device("b0")]), "generation": 626.0}  # JSON Schema: an integer
        answer = await api.post("/hosts/host-a/heartbeat", content=json.dumps(beat), headers=JSON)
        assert answer.status_code == 200, answer.text
        half = await api.post("/hosts/host-a/heartbeat", content=json.dumps({**beat, "generation": 626.5}),
                              headers=JSON)
        assert half.status_code == 422 and "generation" in half.json()["message"]
        key = {"Idempotency-Key": "k-1"}
        assert (await api.post("/leases", json={"device": "b0"}, headers=key)).status_code == 201
        reused = await api.post("/leases", json={"device": "b1"}, headers=key)
        assert reused.status_code == 422 and reused.json()["error"] == "idempotency_key_reused"
        assert "Idempotency-Key used before" in described["components"]["responses"]["422"]["description"]


def body_schema_says(document: dict, path: str, body: dict) -> bool:
    """Whether the document takes ``body`` for the POST of ``path``."""
    ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**ref, "components": document["components"]}).is_valid(body)


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_the_document_and_the_rules_agree_on_what_a_request_may_be(tmp_path):
    """What the rules refuse as malformed (422), the document refuses; what the document takes,
    the rules refuse only for the lab's state (404, 409), as the document says of them."""
    described = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, 86400, single_user=True)
    async with in_process_lab(tmp_path) as (client, _, _):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0"), device("b1")])
        lease = (await api.post("/leases", json={"device": "b1"})).json()
        run, ab = {"run": ["true"]}, {"ab": {"baseline": ["a"], "patch": ["b"]}}
        nowhere = "sha256:0123456789"  # (an image nobody has: 404)
        cases = [  # (path, body, what the document says)
            ("/api/v1/leases", {}, False), ("/api/v1/leases", {"tags": []}, False),
            ("/api/v1/leases", {"device": "b0", "class": "sim-board"}, False),
            ("/api/v1/leases", {"device": "b0", "tags": ["sim"]}, False),
            ("/api/v1/leases", {"class": "sim-board", "tags": ["sim"], "queue": True}, True),
            ("/api/v1/leases", {"tags": ["nothing-has-it"], "device": None}, True),
            ("/api/v1/jobs", {"spec": {}}, False), ("/api/v1/jobs", {"spec": {"run": []}}, False),
            ("/api/v1/jobs", {"spec": {**run, "ab": {"baseline": ["a"], "patch": ["b"]}}}, False),
            ("/api/v1/jobs", {"spec": {**run, "matrix": {"over": ["tags=sim"]}}}, False),
            ("/api/v1/jobs", {"spec": run}, True),
            ("/api/v1/jobs", {"spec": {"ab": {"baseline": ["a"], "patch": ["b"]}, "run": []}}, True),
            ("/api/v1/leases/{lease_id}/power", {"action": "on", "off_time_s": 5}, False),
            ("/api/v1/leases/{lease_id}/power", {"action": "cycle", "off_time_s": 5}, True),
            ("/api/v1/admin/devices/{device}/power", {"action": "status", "off_time_s": 0}, False),
            ("/api/v1/jobs", {"spec": {**run, "fallback": "real-hw"}}, False),  # (needs: real-hw)
            ("/api/v1/jobs", {"spec": {**run, "needs": "any", "fallback_after_s": 5}}, False),
            ("/api/v1/jobs", {"spec": {**run, "needs": "any", "fallback": "real-hw", "fallback_after_s": 5}}, True),
            ("/api/v1/jobs", {"spec": {**ab, "matrix": {"over": ["colour=red"]}}}, False),
            ("/api/v1/jobs", {"spec": {**ab, "matrix": {"over": ["tags= , "]}}}, False),
            ("/api/v1/jobs", {"spec": {**ab, "matrix": {"over": ["device=" + "b" * 65]}}}, False),
            ("/api/v1/jobs", {"spec": {**ab, "target": {"device": "b0"}, "matrix": {"over": ["class=sim-board"]}}},
             False),
            ("/api/v1/jobs", {"spec": {**ab, "target": {"device": "b0"}, "matrix": {"over": [" device = b1 "]}}},
             True),
            ("/api/v1/jobs", {"spec": {**ab, "matrix": {"over": ["tags=sim,, fast ", "class=sim-board"]}}}, True),
            ("/api/v1/jobs", {"spec": {**ab, "target": {"device": "b0", "tags": ["sim"]}}}, False),
            ("/api/v1/jobs", {"spec": {**run, "metrics": [{"name": "t", "regex": "took ([0-9]+)"}]}}, False),
            ("/api/v1/leases/{lease_id}/operations", {"kind": "flash"}, False),
            ("/api/v1/leases/{lease_id}/operations", {"kind": "flash", "args": {"image": "sha256:no"}}, False),
            ("/api/v1/leases/{lease_id}/operations", {"kind": "flash", "args": {"image": nowhere, "to": 1}},
             False),
            ("/api/v1/leases/{lease_id}/operations", {"kind": "flash", "args": {"image": nowhere}}, True),
            ("/api/v1/leases/{lease_id}/flash", {"image": "sha256:0123"}, False),
            ("/api/v1/leases/{lease_id}/flash", {"image": nowhere}, True),
            ("/api/v1/leases", {"class": "sim-board", "image": "sha256:" + "0" * 65}, False),
        ]
        for path, body, takes in cases:
            assert body_schema_says(described, path, body) is takes, (path, body)
            url = path.removeprefix("/api/v1").format(lease_id=lease["id"], device="b0")
            answer = await api.post(url, json=body)
            assert (answer.status_code != 422) is takes, (path, body, answer.text)

        # a name that names nothing is a 404, a name several images have a 409 (not 422)
        for target in ("b0", "b1"):
            made = await api.post("/images", params={"name": "build-7", "for": target},
                                  content=b"image of " + target.encode())
            assert made.status_code == 201, made.text
        nowhere = await api.post("/images", params={"name": "x", "for": "nothing-like-it"}, content=b"x")
        assert (nowhere.status_code, nowhere.json()["error"]) == (404, "unknown_target")
        assert (await api.post("/images", params={"name": "x", "for": ""}, content=b"x")).status_code == 422
        empty_for = next(p for p in described["paths"]["/api/v1/images"]["post"]["parameters"] if p["name"] == "for")
        assert empty_for["schema"]["minLength"] == 1
        marked = await api.post("/admin/images/build-7/known-good", json={"for": "sim-board"})  # b0's or b1's?
        assert marked.status_code == 409 and marked.json()["error"] == "ambiguous_image", marked.text
        marked = await api.post("/admin/images/sha256:" + hashlib.sha256(b"image of b0").hexdigest()
                                + "/known-good", json={"for": "nothing-like-it"})
        assert (marked.status_code, marked.json()["error"]) == (404, "unknown_target")
        elsewhere = await api.post(f"/leases/{lease['id']}/flash", json={"image": "sha256:" + hashlib.sha256(
            b"image of b0").hexdigest()})  # (b1's lease)
        assert (elsewhere.status_code, elsewhere.json()["error"]) == (409, "image_not_for_device")


@schemathesis.hook
def before_call(context, case, kwargs):
    """(Of every schemathesis run in this process: this test's.) A long-poll answers once what
    it watches changes, so a wait it may take (up to a minute) is cut to a hundredth of a
    second; a wait the coordinator must refuse is sent as it was generated. An Idempotency-Key
    it generated is made the request's own: its few values ("0", "00...0") would otherwise come
    back with other requests, which are refused (422) as the key's reuse they are."""
    wait = (case.query or {}).get("wait")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 < wait <= MAX_WAIT_S:
        case.query["wait"] = 0.01
    key = (case.headers or {}).get("Idempotency-Key")
    if key and len(key) <= MAX_KEY_CHARS:
        request = repr((case.method, case.operation.path, case.path_parameters, case.query, case.body))
        case.headers["Idempotency-Key"] = (hashlib.sha256(request.encode()).hexdigest()[:16] + key)[:MAX_KEY_CHARS]


@pytest.fixture
def database_url(database, request):
    """An empty database for a coordinator: None (its own SQLite file) or a database of its
    own on the test PostgreSQL server."""
    return None if database == "sqlite" else request.getfixturevalue("postgres_database")


def admin_token(database_url: str) -> str:
    """A new admin token, made on the database itself (``admin token create --database-url URL``)."""
    made = CliRunner().invoke(cli, ["admin", "token", "create", "root", "--admin", "--database-url", database_url,
                                    "--json"])
    assert made.exit_code == 0, made.output
    return json.loads(made.output)["token"]


def board(name: str) -> DeviceReport:
    """A board with a console and a flash target, as an exporter reports it."""
    return DeviceReport(name=name, device_class="sim-board", resources=[
        ResourceReport(kind="uart", plugin="sim", identifier=f"sim:{name}"),
        ResourceReport.model_validate(flash_target(name))])


def seed(api: requests.Session) -> dict[str, list]:
    """A host with two boards and a network find, a lease, an image, a flash, a token:
    what there is, by the parameters that name it (so that a request reaches more than
    a 404)."""
    def made(path: str, status: int = 201, **request) -> dict:
        answer = api.post(API_PREFIX + path, **request)
        assert answer.status_code == status, answer.text
        return answer.json()

    report = Heartbeat(protocol=PROTOCOL_VERSION, version="test", boot_id="boot-1", generation=1, heartbeat_s=1,
                       devices=[board("b0"), board("b1")],
                       candidates=[CandidateReport(identifier="10.0.0.9:5555", kind="adb", plugin="adb")])
    made("/hosts/host-a/heartbeat", 200, data=report.model_dump_json(by_alias=True), headers=JSON)
    lease = made("/leases", json={"device": "b0"})
    image = b"firmware" * 128
    made("/images", params={"name": "build-7", "for": "b0"}, data=image)
    op = made(f"/leases/{lease['id']}/flash", json={"image": "build-7"})
    token = made("/admin/tokens", json={"user": "carol"})
    sha256 = hashlib.sha256(image).hexdigest()
    return {"path.name": ["b0", "host-a"], "path.device": ["b0", "b1"], "path.host": ["host-a"],
            "path.lease_id": [lease["id"]], "path.op_id": [op["id"]], "path.ref": ["build-7", sha256],
            "path.sha256": [sha256], "path.token_id": [token["id"]], "path.identifier": ["10.0.0.9:5555"],
            "query.device": ["b0"], "query.for": ["b0", "sim-board"], "query.unless": ["pending", "active", "queued"],
            "body.device": ["b0", "b1"], "body.class": ["sim-board"], "body.image": ["build-7"], "body.for": ["b1", "sim-board"],
            "header.X-Device-Loop-User": [lease["holder"]]}


@pytest.mark.timeout(480)  # a safety net: some 45 CPU-s in this process, 88 s beside the other tests
# (./lab test runs five at once), 155 s with two busy loops beside them too
def test_schemathesis_finds_no_server_error_and_no_answer_off_the_document(database, database_url, tmp_path):
    """schemathesis' run, in this process, against the app a coordinator serves, made as ``device-loop
    coordinator`` makes it (the HTTP server in front of it, uvicorn, is test_hostile_http.py's)."""
    # each database as labs run on it: SQLite under `device-loop up` (the trust mode), PostgreSQL with tokens
    trust, url = database == "sqlite", database_url or sqlite_url(tmp_path / "coord")
    token = None if trust else admin_token(url)
    app = create_app(url, Settings(image_dir=str(tmp_path / "coord" / "images")), single_user=trust)
    try:
        with schemathesis_in_process.client(app, {"Authorization": f"Bearer {token}"} if token
                                            else {"X-Device-Loop-User": "alice"}) as api:
            known = seed(api)
        # half of the values of these parameters name what there is, half are schemathesis'
        config = {"dictionaries": {f"known-{n}": {"values": values} for n, values in enumerate(known.values())},
                  "parameters": {parameter: {"dictionary": f"known-{n}", "probability": 0.5}
                                 for n, parameter in enumerate(known)},
                  "operations": [{"include-operation-id": operation, "checks": {
                      "positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}}}
                      for operation in sorted(REFUSED_WHEN_STATE_SAYS)],
                  "checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
        if token:  # the document's own scheme: its checks may then leave it out (a global -H would not)
            config["auth"] = {"openapi": {"token": {"bearer": token}}}
        code, report = schemathesis_in_process.run(
            app, API_PREFIX + "/openapi.json", config, tmp_path, checks=["all"],
            exclude_checks=NOT_IN_THE_TRUST_MODE if trust else [],
            # the coverage phase (every boundary of every parameter, most of the run's time) once,
            # on SQLite: the routes and their models are the same on PostgreSQL
            phases=["examples", "coverage", "fuzzing", "stateful"] if trust else ["examples", "fuzzing", "stateful"],
            max_examples=2)
    finally:
        schemathesis_in_process.stop()
    assert code == 0, report[-20000:]


def test_the_api_prefix_is_written_once_and_every_route_of_the_table_is_its_calls():
    """The call table's paths are under the one prefix, which it never spells (``Call.route``
    is the path served), and every route made from it serves its call: the upload too, a
    real entry of the table, not a stub replaced by name."""
    table = {c.name: c for c in CALLS if c.path is not None}
    assert not [c.name for c in table.values() if c.path.startswith("/api")]
    assert "/api/v1" not in Path(inspect.getfile(CALLS[0].run)).read_text()
    served = {(m, p): h for m, p, _, h in ROUTES if getattr(h, "call", None) is not None}
    assert {(c.method, c.route) for c in table.values()} == set(served)
    assert all(p.startswith(API_PREFIX + "/") and h.call is table[h.call.name] for (m, p), h in served.items())
    assert table["upload_image"].streamed and served[("POST", API_PREFIX + "/images")].call.run.__name__ \
        == "upload_image"

