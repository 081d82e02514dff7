"""Fixtures: a real device-worker and agent-gateway (debug binaries built by
`cargo build -p device-worker -p agent-gateway`) on free loopback ports, and corpus episodes.

Environment: TANDEM_MODEL (GGUF; default ~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf),
TANDEM_CORPUS (default <repo>/../shared/corpus/raw), TANDEM_BIN_DIR (default
$CARGO_TARGET_DIR/debug or <repo>/target/debug).

A missing model or corpus skips the tests that need it, or fails them when
TANDEM_REQUIRE_INPUTS=1 (exported by tools/test.sh, hence CI): there, a test that cannot run
never passes as skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import time
import sys
import types
from typing import NoReturn

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))
import child_procs  # noqa: E402  (the repo's tools/child_procs.py: stop, wait_http_ok)
CONTACTS_EPISODE = "androidworld_episodes_t3a/ContactsAddContact_base_o4-mini_trial1.json"


def _bin_dir() -> pathlib.Path:
    if os.environ.get("TANDEM_BIN_DIR"):
        return pathlib.Path(os.environ["TANDEM_BIN_DIR"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / "debug"


def _model() -> pathlib.Path:
    default = pathlib.Path(os.environ.get("TANDEM_CACHE", pathlib.Path.home() / ".cache/tandem")) / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    return pathlib.Path(os.environ.get("TANDEM_MODEL") or default)


def require_inputs() -> bool:
    """Whether TANDEM_REQUIRE_INPUTS=1: every test input is required."""
    return os.environ.get("TANDEM_REQUIRE_INPUTS", "").strip() == "1"


def missing_input(what: str) -> NoReturn:
    """A test input is missing: a failure under TANDEM_REQUIRE_INPUTS=1, else a skip."""
    message = f"required test input missing: {what}"
    if require_inputs():
        pytest.fail(f"{message} (TANDEM_REQUIRE_INPUTS=1)", pytrace=False)
    pytest.skip(f"{message} (a failure with TANDEM_REQUIRE_INPUTS=1)")


def corpus_root() -> pathlib.Path:
    root = pathlib.Path(os.environ.get("TANDEM_CORPUS") or REPO.parent / "shared/corpus/raw")
    if not root.is_dir():
        missing_input(f"corpus folder {root} not found; set TANDEM_CORPUS=<corpus>/raw")
    return root


def load_androidworld_episode(rel: str = CONTACTS_EPISODE) -> tuple[str, list[list[dict]]]:
    """(goal, [ui_elements per step]) of an AndroidWorld T3A episode log of the corpus."""
    path = corpus_root() / rel
    log = json.loads(path.read_text())
    return log["goal"], [r["state"]["ui_elements"] for r in log["step_records"]]


def first_step_result(client, episode_id: str):
    """The one StepResult of a step (16 tokens at most) of the first screen of the corpus's
    Contacts episode, sent by ``client`` (a ``tandem_client.AgentClient``) as ``episode_id``."""
    from tandem_client import StepResult

    goal, screens = load_androidworld_episode()
    results = [ev for ev in client.step(screens[0], task=goal, episode_id=episode_id, max_tokens=16)
               if isinstance(ev, StepResult)]
    assert len(results) == 1
    return results[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(gateway_bin: pathlib.Path, proc: subprocess.Popen, addr: str, service: str, log: pathlib.Path, seconds: int,
                 extra: tuple[str, ...] = ()) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{addr}: server exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        r = subprocess.run([str(gateway_bin), "health", "--addr", addr, "--service", service, *extra],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{addr} not SERVING after {seconds} s: {r.stderr.strip()}; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


@pytest.fixture(scope="session")
def model_path() -> pathlib.Path:
    """The default model (TANDEM_MODEL): skipped, or failed under TANDEM_REQUIRE_INPUTS=1, when missing."""
    model = _model()
    if not model.is_file():
        missing_input(f"model file {model} not found; run tools/fetch_model.sh and set TANDEM_MODEL=<the path it prints>")
    return model


@contextlib.contextmanager
def _worker_and_gateway(logs: pathlib.Path, worker_args: list[str], gateway_args: list[str]):
    """Starts the debug device-worker (``serve --listen`` on a free port, 2 threads, 2 slots,
    plus ``worker_args``), waits until it serves, then an agent-gateway routed to it (``serve
    --listen --worker`` plus ``gateway_args``); logs in ``logs``. Yields ``(worker port,
    gateway port, gateway process)``; stops both on exit."""
    bins = _bin_dir()
    worker_bin, gateway_bin = bins / "device-worker", bins / "agent-gateway"
    for b in (worker_bin, gateway_bin):
        if not b.exists():
            pytest.fail(f"{b} not found; build with `cargo build -p device-worker -p agent-gateway`")
    wp, gp = _free_port(), _free_port()
    procs: list[subprocess.Popen] = []
    try:
        wlog = logs / "worker.log"
        worker = subprocess.Popen(
            [str(worker_bin), "serve", "--listen", f"127.0.0.1:{wp}", "--threads", "2", "--slots", "2", *worker_args],
            stdout=wlog.open("w"), stderr=subprocess.STDOUT)
        procs.append(worker)
        _wait_health(gateway_bin, worker, f"http://127.0.0.1:{wp}", "tandem.step.v1.StepService", wlog, 120)
        glog = logs / "gateway.log"
        gateway = subprocess.Popen(
            [str(gateway_bin), "serve", "--listen", f"127.0.0.1:{gp}", "--worker", f"http://127.0.0.1:{wp}", *gateway_args],
            stdout=glog.open("w"), stderr=subprocess.STDOUT)
        procs.append(gateway)
        _wait_health(gateway_bin, gateway, f"http://127.0.0.1:{gp}", "", glog, 30)
        yield wp, gp, gateway
    finally:
        for p in reversed(procs):
            child_procs.stop(p)


@pytest.fixture(scope="session")
def servers(tmp_path_factory, model_path):
    """A device-worker (2 slots) and an agent-gateway with its HTTP endpoint, both on loopback.

    Yields a namespace: `grpc_target` (gateway host:port), `worker_target`, `http_base`
    (`http://127.0.0.1:PORT`), `openai_base` (`.../v1`).
    """
    logs = tmp_path_factory.mktemp("logs")
    hp = _free_port()
    with _worker_and_gateway(logs, ["--model", str(model_path), "--reflection"],
                             ["--http-listen", f"127.0.0.1:{hp}", "--reflection"]) as (wp, gp, gateway):
        child_procs.wait_http_ok(f"http://127.0.0.1:{hp}/health", gateway, 30)
        yield types.SimpleNamespace(
            grpc_target=f"127.0.0.1:{gp}",
            worker_target=f"127.0.0.1:{wp}",
            http_base=f"http://127.0.0.1:{hp}",
            openai_base=f"http://127.0.0.1:{hp}/v1",
            logs=logs,
        )


#: The tiny Qwen3.5-VL fixture (text GGUF and projector; device-worker/tests/fixtures/qwen35vl/README.md).
VL_FIXTURE = REPO / "device-worker/tests/fixtures/qwen35vl"
#: The VL worker's --image-max-tokens in these tests (small: a step encodes quickly).
VL_IMAGE_MAX_TOKENS = 64


@pytest.fixture(scope="session")
def vl_servers(tmp_path_factory):
    """A device-worker on the tiny VL fixture with its projector (``--mmproj``,
    ``--image-max-tokens 64``) and an agent-gateway with ``--screenshots always`` in front of
    it. Yields a namespace: `grpc_target`, `worker_target`."""
    model, mmproj = VL_FIXTURE / "tiny-qwen35vl-f32.gguf", VL_FIXTURE / "mmproj-tiny-qwen35vl-f32.gguf"
    for f in (model, mmproj):
        if not f.is_file():
            missing_input(f"VL fixture {f}; run tools/fixtures/make_qwen35vl_fixture.py")
    worker_args = ["--model", str(model), "--mmproj", str(mmproj), "--image-max-tokens", str(VL_IMAGE_MAX_TOKENS)]
    with _worker_and_gateway(tmp_path_factory.mktemp("vl-logs"), worker_args,
                             ["--http-listen", "off", "--screenshots", "always"]) as (wp, gp, _):
        yield types.SimpleNamespace(grpc_target=f"127.0.0.1:{gp}", worker_target=f"127.0.0.1:{wp}")


@pytest.fixture(scope="module")
def authed_gateway(servers, tmp_path_factory):
    """A second agent-gateway in front of the same worker that requires a bearer token
    (`--auth-token-file`) on AgentService and its HTTP endpoint. Yields a namespace:
    `grpc_target`, `http_base`, `token`, `token_file`."""
    import secrets

    bins = _bin_dir()
    gateway_bin = bins / "agent-gateway"
    d = tmp_path_factory.mktemp("auth")
    token = secrets.token_hex(32)
    token_file = d / "tokens"
    token_file.write_text(f"# test token\n{token}\n")
    gp, hp = _free_port(), _free_port()
    glog = d / "gateway.log"
    gateway = subprocess.Popen(
        [str(gateway_bin), "serve", "--listen", f"127.0.0.1:{gp}", "--worker", f"http://{servers.worker_target}",
         "--http-listen", f"127.0.0.1:{hp}", "--auth-token-file", str(token_file)],
        stdout=glog.open("w"), stderr=subprocess.STDOUT)
    try:
        _wait_health(gateway_bin, gateway, f"http://127.0.0.1:{gp}", "", glog, 30)
        child_procs.wait_http_ok(f"http://127.0.0.1:{hp}/health", gateway, 30)
        yield types.SimpleNamespace(grpc_target=f"127.0.0.1:{gp}", http_base=f"http://127.0.0.1:{hp}",
                                    token=token, token_file=str(token_file))
    finally:
        child_procs.stop(gateway)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_test_pki(d: pathlib.Path) -> types.SimpleNamespace:
    """A test CA, a server certificate for localhost and 127.0.0.1 and a client certificate,
    made with the openssl commands of deploy/README.md. Returns their paths (`ca`,
    `server_cert`, `server_key`, `client_cert`, `client_key`)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=tandem-test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, san in (("server", "DNS:localhost,IP:127.0.0.1"), ("client", "DNS:controller")):
        ext = d / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        _openssl("req", *ec, "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-days", "2", "-out", str(d / f"{name}.pem"), "-extfile", str(ext))
    return types.SimpleNamespace(ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"), server_key=str(d / "server.key"),
                                 client_cert=str(d / "client.pem"), client_key=str(d / "client.key"))


@pytest.fixture(scope="module")
def tls_gateway(servers, tmp_path_factory):
    """A second agent-gateway in front of the same worker with mutual TLS on AgentService and
    its HTTP endpoint (`--tls-cert`, `--tls-key`, `--tls-client-ca`; certificates from
    :func:`make_test_pki`). Yields a namespace: `grpc_target` (`localhost:PORT`), `http_base`
    (`https://localhost:PORT`), `pki`."""
    bins = _bin_dir()
    gateway_bin = bins / "agent-gateway"
    d = tmp_path_factory.mktemp("tls")
    pki = make_test_pki(d)
    gp, hp = _free_port(), _free_port()
    glog = d / "gateway.log"
    gateway = subprocess.Popen(
        [str(gateway_bin), "serve", "--listen", f"127.0.0.1:{gp}", "--worker", f"http://{servers.worker_target}",
         "--http-listen", f"127.0.0.1:{hp}", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
         "--tls-client-ca", pki.ca],
        stdout=glog.open("w"), stderr=subprocess.STDOUT)
    try:
        _wait_health(gateway_bin, gateway, f"https://localhost:{gp}", "", glog, 30,
                     ("--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key))
        yield types.SimpleNamespace(grpc_target=f"localhost:{gp}", http_base=f"https://localhost:{hp}", pki=pki)
    finally:
        child_procs.stop(gateway)
