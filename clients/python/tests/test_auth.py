"""A gateway that requires a bearer token: AgentClient and OpenAI-style HTTP calls without
it are refused (gRPC UNAUTHENTICATED, HTTP 401 with an OpenAI error object), with it they
work; health stays open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import first_step_result
from tandem_client import AgentClient


def test_agent_client_needs_the_token(authed_gateway):
    with AgentClient(authed_gateway.grpc_target, timeout_s=120) as anon:
        with pytest.raises(grpc.RpcError) as e:
            first_step_result(anon, "py-auth")
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "missing bearer token" in e.value.details()
    with AgentClient(authed_gateway.grpc_target, timeout_s=120, token="0" * 32) as wrong:
        with pytest.raises(grpc.RpcError) as e:
            first_step_result(wrong, "py-auth")
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with AgentClient(authed_gateway.grpc_target, timeout_s=300, token_file=authed_gateway.token_file) as ok:
        result = first_step_result(ok, "py-auth")
        assert result.raw_output, result


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_endpoint_needs_the_token_and_health_stays_open(authed_gateway):
    status, body = _get(f"{authed_gateway.http_base}/v1/models")
    assert status == 401, body
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    status, body = _get(f"{authed_gateway.http_base}/v1/models", authed_gateway.token)
    assert status == 200, body
    assert _get(f"{authed_gateway.http_base}/health")[0] == 200
