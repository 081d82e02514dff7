"""A gateway with mutual TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`; certificates from
the openssl commands of deploy/README.md): AgentClient with the CA and a client certificate
runs a step, without the certificate or without TLS it is refused; the HTTP endpoint answers
over HTTPS to a client with the certificate."""

from __future__ import annotations

import json
import ssl
import urllib.request

import grpc
import pytest

from conftest import first_step_result
from tandem_client import AgentClient


def test_agent_client_over_mutual_tls(tls_gateway):
    pki = tls_gateway.pki
    with AgentClient(tls_gateway.grpc_target, timeout_s=300, tls_ca=pki.ca, tls_cert=pki.client_cert,
                     tls_key=pki.client_key) as ok:
        assert first_step_result(ok, "py-tls").raw_output
    with AgentClient(tls_gateway.grpc_target, timeout_s=30, tls_ca=pki.ca) as no_cert:
        with pytest.raises(grpc.RpcError) as e:
            first_step_result(no_cert, "py-tls")
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    with AgentClient(tls_gateway.grpc_target, timeout_s=30) as plaintext:
        with pytest.raises(grpc.RpcError) as e:
            first_step_result(plaintext, "py-tls")
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    with pytest.raises(ValueError, match="go together"):
        AgentClient(tls_gateway.grpc_target, tls_ca=pki.ca, tls_cert=pki.client_cert)


def test_http_endpoint_over_mutual_tls(tls_gateway):
    pki = tls_gateway.pki
    ctx = ssl.create_default_context(cafile=pki.ca)
    ctx.load_cert_chain(pki.client_cert, pki.client_key)
    with urllib.request.urlopen(f"{tls_gateway.http_base}/v1/models", context=ctx, timeout=30) as r:
        assert r.status == 200
        assert json.loads(r.read())["object"] == "list"
    without = ssl.create_default_context(cafile=pki.ca)
    with pytest.raises(OSError):
        with urllib.request.urlopen(f"{tls_gateway.http_base}/health", context=without, timeout=30) as r:
            r.read()
