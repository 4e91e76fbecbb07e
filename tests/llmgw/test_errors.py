"""llmgw.errors: one ApiError, written in each route family's shape, bytes as clients read them."""

from __future__ import annotations

import json

from llmgw.errors import ANTHROPIC, API_V1, HF, RESPONSES, SCIM, ApiError, cluster_error


def _refused() -> ApiError:
    return ApiError(
        503, "no replica", "server_error", "model_not_ready", "model", headers={"Retry-After": "3"}
    )


def test_openai_body_and_stream_event() -> None:
    error = _refused()
    body = (
        b'{"error":{"message":"no replica","type":"server_error","param":"model",'
        b'"code":"model_not_ready"}}'
    )
    assert error.body() == body
    assert error.sse_event() == b"data: " + body + b"\n\n"
    response = error.response()
    assert (response.status, response.headers["Retry-After"]) == (503, "3")


def test_api_v1_answer_names_code_before_param_and_leaves_out_none() -> None:
    assert API_V1.body(_refused()) == (
        b'{"error":{"message":"no replica","type":"server_error","code":"model_not_ready",'
        b'"param":"model"}}'
    )
    bare = ApiError(404, "no url", "invalid_request_error")  # no code: its type stands in
    assert API_V1.body(bare) == (
        b'{"error":{"message":"no url","type":"invalid_request_error",'
        b'"code":"invalid_request_error"}}'
    )


def test_anthropic_keeps_status_headers_and_code_for_the_log() -> None:
    error = _refused().reshaped(ANTHROPIC)
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"no replica"}}'
    assert error.body() == body
    assert error.sse_event() == b"event: error\ndata: " + body + b"\n\n"
    assert (error.status, error.headers, error.detail.code) == (
        503,
        {"Retry-After": "3"},
        "model_not_ready",
    )
    assert error.reshaped(ANTHROPIC) is error


def test_responses_event_is_numbered_after_the_streams_events() -> None:
    error = _refused().reshaped(RESPONSES)
    error.sequence_number = 4
    assert error.body() == _refused().body()  # an answer not begun: OpenAI's body
    event = json.loads(error.sse_event().removeprefix(b"event: error\ndata: "))
    assert event == {
        "code": "model_not_ready",
        "message": "no replica",
        "param": "model",
        "sequence_number": 4,
        "type": "error",
    }


def test_scim_and_hub_do_not_take_an_openai_code_as_their_own() -> None:
    scim = _refused().reshaped(SCIM).response()
    assert scim.content_type == "application/scim+json"
    assert json.loads(scim.text or "") == {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:Error"],
        "status": "503",
        "detail": "no replica",
    }
    hub = _refused().reshaped(HF).response()
    assert json.loads(hub.text or "") == {"error": "no replica"}
    assert hub.headers["X-Error-Message"] == "no replica"
    assert "X-Error-Code" not in hub.headers


def test_cluster_port_body_leaves_out_an_empty_code() -> None:
    assert cluster_error(400, "bad").text == '{"error": "bad"}'
    assert cluster_error(403, "no", "token_used").text == '{"error": "no", "code": "token_used"}'
