"""Bad input is refused with a 4xx (or an ``error`` frame), never a 500 or a closed socket, and changes nothing.

Before kernel/request_limits.py: a name with a NUL byte was an HTML 500 (PostgreSQL cannot store NUL, a
``DataError``) and a body nested 5,000 levels a ``RecursionError`` 500; an agent frame nested 3,000 levels (6 KB)
closed the agent's socket with 1011. Each case below is one of those, in every place a request carries input.
"""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.test import override_settings
from rest_framework.test import APIClient

from kernel import request_limits
from nodeagent import protocol
from scheduler.fleet.telemetry import latest_store
from scheduler.models import Job
from tenants.models import Tenant
from tests.factories import ApiTokenFactory, SystemAdminFactory, bearer
from tests.fleet.conftest import browser_socket, connect_agent, register_node, settle, telemetry
from tests.frontend.factories import make_flavor, make_member, make_tenant
from tests.security.conftest import assert_unchanged, state_fingerprint

db = database_sync_to_async


def nested(depth: int, leaf: object = 1) -> object:
    """``depth`` arrays and objects, alternating, around ``leaf``."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


def nested_text(depth: int) -> str:
    """The JSON text of ``depth`` levels built as text (``json.dumps`` itself recurses once per level)."""
    pairs, odd = divmod(depth, 2)
    return '{"a":[' * pairs + ("[1]" if odd else "1") + "]}" * pairs


@pytest.fixture
def api(db) -> APIClient:
    client = APIClient()
    client.credentials(**{"HTTP_" + k.upper().replace("-", "_"): v for k, v in _admin_headers().items()})
    return client


def _admin_headers() -> dict[str, str]:
    return bearer(ApiTokenFactory(user=SystemAdminFactory(), scope="admin"))


def _refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body


# --- NUL bytes ------------------------------------------------------------------------------------------------


def test_a_nul_in_a_json_value_is_a_400_naming_the_field(api):
    before = state_fingerprint()
    body = _refused(
        api.post("/api/v1/tenants/", {"name": "evil\x00name", "slug": "evil"}, format="json"), 400, "nul_byte"
    )
    assert "name" in body["detail"]
    assert_unchanged(before, state_fingerprint(), "NUL in a JSON value")


def test_a_nul_in_a_json_key_is_a_400(api):
    response = api.post(
        "/api/v1/tenants/", '{"name": "ok", "slug": "ok", "x\\u0000y": 1}', content_type="application/json"
    )
    _refused(response, 400, "nul_byte")
    assert not Tenant.objects.filter(slug="ok").exists()


def test_a_nul_deep_inside_a_json_body_is_a_400(api):
    body = {"name": "ok", "slug": "ok", "labels": {"a": [{"b": "\x00"}]}}
    assert "labels.a[0].b" in _refused(api.post("/api/v1/tenants/", body, format="json"), 400, "nul_byte")["detail"]


def test_an_escaped_backslash_before_u0000_is_not_a_nul(api):
    # "\\u0000" in JSON is a backslash and the text u0000: legal, and the view answers it on its own.
    response = api.post("/api/v1/tenants/", '{"name": "a\\\\u0000", "slug": "x y"}', content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "invalid"


@pytest.mark.parametrize("query", ["name=a%00b", "a%00b=1", "state=%00"])
def test_a_nul_in_the_query_string_is_a_400(api, query):
    _refused(api.get(f"/api/v1/jobs/?{query}"), 400, "nul_byte")


def test_a_nul_in_the_url_path_is_a_400(api):
    _refused(api.get("/api/v1/tenants/1%00/"), 400, "nul_byte")


def test_a_nul_in_a_header_is_a_400(api):
    _refused(api.get("/api/v1/tenants/", HTTP_X_FORWARDED_HOST="a\x00b"), 400, "nul_byte")


def test_a_nul_in_an_api_form_field_is_a_400(api):
    before = state_fingerprint()
    response = api.post("/api/v1/tenants/", {"name": "evil\x00", "slug": "evil"}, format="multipart")
    _refused(response, 400, "nul_byte")
    response = api.post("/api/v1/tenants/", "name=evil%00&slug=evil", content_type="application/x-www-form-urlencoded")
    assert "name" in _refused(response, 400, "nul_byte")["detail"]
    assert_unchanged(before, state_fingerprint(), "NUL in a form field")


@pytest.mark.django_db
def test_a_nul_in_a_console_form_field_is_the_400_page(client):
    make_flavor("nvidia-h100-80g")
    user = make_member(make_tenant("acme"), username="bob")
    client.force_login(user)
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": "{}", "f-name": "a\x00"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_nul_or_deep_nesting_in_the_consoles_pasted_job_spec_is_a_form_error(client):
    make_flavor("nvidia-h100-80g")
    client.force_login(make_member(make_tenant("acme"), username="bob"))
    spec = {"name": "nul\x00", "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1}, "command": ["x"]}
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": json.dumps(spec)})
    assert response.status_code == 200 and "NUL character" in response.content.decode()
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": nested_text(5000)})
    assert response.status_code == 200 and "levels deep" in response.content.decode()
    assert not Job.objects.exists()


# --- nesting depth and size -----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", ["5,000 levels", "one past the limit"])
def test_a_body_nested_past_the_limit_is_a_400(api, settings, depth):
    depth = 5000 if depth == "5,000 levels" else settings.GPUPOOL_MAX_JSON_DEPTH + 1
    response = api.post("/api/v1/jobs/", nested_text(depth), content_type="application/json")
    assert "levels deep" in _refused(response, 400, "too_deep")["detail"]


def test_a_body_at_the_depth_limit_reaches_the_view(api, settings):
    body = {"name": "deep", "tenant": "nobody", "resources": {"gpus": 1}, "command": ["x"], "env": {}}
    body["labels"] = nested(settings.GPUPOOL_MAX_JSON_DEPTH - 1)
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400 and response.json()["code"] != "too_deep", response.json()


def test_the_depth_limit_is_a_setting(api, settings):
    settings.GPUPOOL_MAX_JSON_DEPTH = 3
    response = api.post("/api/v1/tenants/", {"name": {"a": {"b": 1}}}, format="json")
    assert response.json()["code"] == "invalid"  # three levels: within the limit, the serializer's answer
    _refused(api.post("/api/v1/tenants/", {"name": {"a": {"b": [1]}}}, format="json"), 400, "too_deep")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_an_oversized_body_is_413_for_json_and_forms(api):
    big = "x" * 5000
    _refused(api.post("/api/v1/tenants/", {"name": big, "slug": "big"}, format="json"), 413, "request_too_large")
    response = api.post("/api/v1/tenants/", f"name={big}&slug=big", content_type="application/x-www-form-urlencoded")
    _refused(response, 413, "request_too_large")
    assert not Tenant.objects.filter(slug="big").exists()


def test_not_json_is_still_the_parsers_own_400(api):
    response = api.post("/api/v1/tenants/", "{not json", content_type="application/json")
    _refused(response, 400, "parse_error")


def test_the_check_walks_iteratively_and_names_the_place():
    with pytest.raises(request_limits.BadInput) as caught:
        request_limits.check_json_value(nested(100_000), max_depth=64)
    assert caught.value.code == "too_deep"
    request_limits.check_json_value(nested(64), max_depth=64)
    with pytest.raises(request_limits.BadInput, match=r"at spec\.env\.A"):
        request_limits.check_json_value({"spec": {"env": {"A": "a\x00"}}}, max_depth=64)


# --- agent and viewer frames ----------------------------------------------------------------------------------


def test_decode_refuses_frames_nested_past_the_limit_before_parsing():
    head = '{"v":1,"type":"heartbeat","id":"h","seq":1,"x":'
    for depth, ok in ((protocol.MAX_FRAME_DEPTH - 1, True), (protocol.MAX_FRAME_DEPTH, False), (3000, False)):
        frame = head + "[" * depth + "]" * depth + "}"
        for text in (frame, frame.encode()):
            if ok:
                assert protocol.decode(text).type == "heartbeat"
            else:
                with pytest.raises(protocol.ProtocolError) as caught:
                    protocol.decode(text)
                assert caught.value.code == protocol.ErrorCode.TOO_LARGE and "levels deep" in caught.value.detail
    # Brackets inside strings are text, not nesting; unbalanced brackets are malformed, not parsed.
    assert protocol.decode(head + '"' + "[" * 3000 + '"}').type == "heartbeat"
    assert protocol.decode(head + '"\\"' + "[" * 3000 + '\\""}').type == "heartbeat"  # with escaped quotes
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.decode(head + "[" * 3000 + "}")
    assert caught.value.code == protocol.ErrorCode.MALFORMED


def test_decode_refuses_a_nul_escape_but_not_an_escaped_backslash():
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.decode('{"v":1,"type":"heartbeat","id":"h\\u0000","seq":1}')
    assert caught.value.code == protocol.ErrorCode.INVALID_FIELD
    assert protocol.decode('{"v":1,"type":"heartbeat","id":"h\\\\u0000","seq":1}').id == "h\\u0000"


@pytest.mark.django_db(transaction=True)
async def test_a_deep_agent_frame_gets_an_error_frame_and_the_socket_keeps_working():
    node, credential = await db(register_node)("gpu-deep")
    socket = await connect_agent(credential, "gpu-deep", devices=1)
    before = await db(state_fingerprint)()
    deep = '{"v":1,"type":"telemetry","id":"deep","samples":' + "[" * 3000 + "]" * 3000 + "}"
    assert len(deep) < 7000
    await socket.send_to(text_data=deep)
    error = json.loads(await socket.receive_from(timeout=5))
    assert (error["type"], error["code"]) == ("error", protocol.ErrorCode.TOO_LARGE), error
    nul = protocol.encode(telemetry(["GPU-gpu-deep-0"])).replace('"GPU-gpu-deep-0"', '"GPU-\\u0000"')
    await socket.send_to(text_data=nul)
    error = json.loads(await socket.receive_from(timeout=5))
    assert (error["type"], error["code"]) == ("error", protocol.ErrorCode.INVALID_FIELD), error
    assert await db(state_fingerprint)() == before
    # The same socket still works: the next valid frame is applied.
    await socket.send_to(text_data=protocol.encode(telemetry(["GPU-gpu-deep-0"], utilization=77.0)))
    await settle(socket)
    latest = await latest_store().aget_nodes([node.pk])
    assert set(latest[node.pk]) == {"GPU-gpu-deep-0"} and "77.0" in json.dumps(latest[node.pk]), latest
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_deep_or_broken_viewer_frame_gets_an_error_and_the_socket_stays_open():
    user = await db(make_member)(await db(make_tenant)("acme"), username="viewer")
    socket = await browser_socket(user)
    connected, _ = await socket.connect()
    assert connected
    assert (await socket.receive_json_from(timeout=5))["type"] == "welcome"
    for frame in ("[" * 2000 + "]" * 2000, "not json", "x" * 10_000):
        await socket.send_to(text_data=frame)
        answer = await socket.receive_json_from(timeout=5)
        assert (answer["type"], answer["code"]) == ("error", "malformed"), answer
    await socket.send_to(text_data=json.dumps({"subscribe": {"node": "x"}}))
    assert (await socket.receive_json_from(timeout=5))["code"] == "forbidden"  # still answering: not an admin
    await socket.disconnect()


# --- types, pagination, unknown URLs: what the schema documents ------------------------------------------------


def test_a_json_value_of_the_wrong_type_is_a_400_naming_the_field(api):
    body = {"name": "typed", "vendor": "nvidia", "model": 12, "memory_mib": "2048"}
    errors = _refused(api.post("/api/v1/flavors/", body, format="json"), 400, "invalid")
    assert errors["errors"] == {"model": ["Must be a string."], "memory_mib": ["Must be an integer."]}
    for wrong in ({"memory_mib": 2048.0}, {"memory_mib": True}, {"vendor": 1}):
        _refused(api.post("/api/v1/flavors/", {**body, "model": "M", **wrong}, format="json"), 400, "invalid")
    # A form body is all text: the fields still convert it.
    response = api.post("/api/v1/flavors/", {**body, "model": "M"}, format="multipart")
    assert response.status_code == 201 and response.json()["memory_mib"] == 2048


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "limit=-5", "offset=-1", "offset=x", "limit="])
def test_a_malformed_limit_or_offset_is_a_400_not_the_default_page(api, query):
    name = query.split("=")[0]
    assert name in _refused(api.get(f"/api/v1/flavors/?{query}"), 400, "invalid")["errors"]


def test_a_wellformed_limit_and_offset_page_as_before(api):
    make_flavor("a-flavor")
    make_flavor("b-flavor")
    body = api.get("/api/v1/flavors/?limit=1&offset=1").json()
    assert body["count"] == 2 and len(body["results"]) == 1 and body["previous"]


def test_an_api_url_no_route_matches_is_a_json_404(api, client):
    _refused(api.get("/api/v1/jobs/not-a-number/"), 404, "not_found")
    _refused(api.post("/api/v1/no-such-thing/"), 404, "not_found")
    assert client.get("/console/no-such-page/")["Content-Type"].startswith("text/html")


def test_every_operation_documents_the_error_answers(api):
    schema = api.get("/api/schema/?format=json").json()
    assert schema["components"]["schemas"]["Error"]["required"] == ["code", "detail"]
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            expected = {"400", "401", "403"} | ({"404"} if "{" in path else set())
            assert expected <= set(responses), (method, path, sorted(responses))
            assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


@pytest.mark.parametrize("value", ["null", "1.2129111921530507e+240", "yes", ""])
def test_a_boolean_filter_refuses_what_is_not_true_or_false(db, value):
    """``?active=null`` on the token list answered 200 with every token (the API fuzz found it)."""
    admin = SystemAdminFactory()
    client = APIClient()
    client.force_authenticate(admin)
    refused = client.get("/api/v1/tokens/", {"active": value})
    assert refused.status_code == 400, refused.content
    assert "active" in refused.json()["errors"]
    assert client.get("/api/v1/tokens/", {"active": "true"}).status_code == 200
    assert client.get("/api/v1/users/", {"is_active": "0"}).status_code == 200
