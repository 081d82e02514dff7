"""A small client for the agent-gateway's gRPC ``AgentService`` (proto/tandem/agent/v1).

- :class:`AgentClient`: ``step(...)`` (one step, tokens streamed) and ``run_episode(...)``
  (one bidirectional stream per episode, see :class:`Episode`).
- :class:`Token` / :class:`StepResult`: the two kinds of event a step streams.
- :func:`make_observation`: builds an ``Observation`` from AndroidWorld UI elements
  (dataclasses or dicts), their JSON, or a uiautomator XML dump, with an optional screenshot
  (PNG/JPEG bytes, or RGB pixels such as AndroidWorld's ``State.pixels``, PNG-encoded by
  :func:`encode_png`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import queue
import struct
import threading
import zlib
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import grpc

try:
    from tandem_client._gen.tandem.agent.v1 import agent_pb2, agent_pb2_grpc
except ImportError as e:  # pragma: no cover - only without generated stubs
    raise ImportError(
        "tandem_client's gRPC stubs are missing; generate them with clients/python/gen_stubs.sh "
        f"(needs grpcio-tools): {e}"
    ) from e

#: Default gateway address (``agent-gateway serve`` listens on 127.0.0.1:50052).
DEFAULT_TARGET = "localhost:50052"


@dataclasses.dataclass(frozen=True)
class Token:
    """A piece of the action text, sent as the worker produces it.

    ``step``: 0-based step of the episode; ``index``: 0-based position in the step's output.
    """

    step: int
    text: str
    index: int


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one step (``tandem.agent.v1.StepResult``).

    ``action_json`` is the validated AndroidWorld JSON action (``""`` when ``error`` is set);
    ``stats`` holds the ``StepStats`` fields (token counts, ``reused_tokens``, times in ms).
    """

    episode_id: str
    step: int
    action_json: str
    action_type: str
    raw_output: str
    error: str
    stats: dict

    @property
    def ok(self) -> bool:
        """True when the step produced a valid action."""
        return not self.error and bool(self.action_json)

    @property
    def action(self) -> Optional[dict]:
        """The action as a dict (``{"action_type": "click", "index": 3}``), or None."""
        return json.loads(self.action_json) if self.action_json else None

    @classmethod
    def from_proto(cls, r: "agent_pb2.StepResult") -> "StepResult":
        stats = {f.name: getattr(r.stats, f.name) for f in r.stats.DESCRIPTOR.fields} if r.HasField("stats") else {}
        return cls(r.episode_id, r.step, r.action_json, r.action_type, r.raw_output, r.error, stats)


Event = Union[Token, StepResult]
ObservationLike = Union["agent_pb2.Observation", str, bytes, list, tuple]
#: A screenshot: encoded PNG or JPEG bytes, or RGB(A) pixels (see :func:`encode_png`).
ScreenshotLike = Union[bytes, bytearray, memoryview, Any]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"


def encode_png(pixels: Any) -> bytes:
    """PNG bytes (8-bit RGB, or RGBA for 4 channels; zlib level 6, no filter) of ``pixels``:
    an array of shape ``(height, width, 3 or 4)`` of uint8 values, such as AndroidWorld's
    ``State.pixels`` (a numpy array), or any object with that ``shape`` and a ``tobytes()``
    giving its row-major bytes. No numpy or Pillow needed.

    Raises ``ValueError`` for another shape or a byte count that does not match it.
    """
    shape = tuple(getattr(pixels, "shape", ()))
    if len(shape) != 3 or shape[2] not in (3, 4) or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"screenshot pixels must have shape (height, width, 3 or 4), got {shape}")
    height, width, channels = (int(x) for x in shape)
    dtype = getattr(pixels, "dtype", None)
    if dtype is not None and str(dtype) != "uint8":
        raise ValueError(f"screenshot pixels must be uint8, got {dtype}")
    raw = pixels.tobytes()
    stride = width * channels
    if len(raw) != height * stride:
        raise ValueError(f"screenshot pixels: {len(raw)} bytes for shape {shape} (expected {height * stride})")
    # Each row: filter type 0 (none), then the row's bytes.
    rows = b"".join(b"\x00" + raw[y * stride:(y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    color_type = 2 if channels == 3 else 6
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return _PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")


def screenshot_bytes(screenshot: Optional[ScreenshotLike]) -> bytes:
    """The bytes ``Observation.screenshot_png`` carries for ``screenshot``: ``b""`` for None,
    PNG or JPEG bytes as they are, pixels PNG-encoded (:func:`encode_png`).

    Raises ``ValueError`` for bytes that are neither PNG nor JPEG (the gateway would refuse
    them with INVALID_ARGUMENT) and for pixels :func:`encode_png` cannot encode.
    """
    if screenshot is None:
        return b""
    if isinstance(screenshot, (bytes, bytearray, memoryview)):
        data = bytes(screenshot)
        if not (data.startswith(_PNG_SIGNATURE) or data.startswith(_JPEG_SIGNATURE)):
            raise ValueError(f"screenshot bytes are neither PNG nor JPEG (start {data[:8].hex(' ')!r})")
        return data
    return encode_png(screenshot)


def _element_dict(e: Any) -> Any:
    if dataclasses.is_dataclass(e) and not isinstance(e, type):
        return dataclasses.asdict(e)
    if isinstance(e, dict):
        return e
    if hasattr(e, "__dict__"):
        return {k: _element_dict(v) if hasattr(v, "__dict__") else v for k, v in vars(e).items()}
    raise TypeError(f"UI element must be a dataclass, a dict or an object with attributes, got {type(e).__name__}")


def elements_to_json(elements: Iterable[Any]) -> str:
    """Serialises AndroidWorld ``UIElement``s (dataclasses, dicts or plain objects) as the JSON
    array the gateway parses: AndroidWorld's field names, ``bbox_pixels`` as
    ``{"x_min", "x_max", "y_min", "y_max"}``, ``None`` as null. Values JSON cannot hold are
    written with ``str``.
    """
    return json.dumps([_element_dict(e) for e in elements], default=str)


def make_observation(screen: ObservationLike, foreground_app: str = "",
                     screenshot: Optional[ScreenshotLike] = None) -> "agent_pb2.Observation":
    """An ``Observation`` from ``screen``: an ``Observation`` (returned as is, with
    ``screenshot`` set when given), a list of UI elements (see :func:`elements_to_json`),
    UI-element JSON text (starting with ``[`` or ``{``) or uiautomator XML text (starting with
    ``<``); ``screenshot`` (see :func:`screenshot_bytes`) goes into ``screenshot_png``. Whether
    the model sees it is the gateway's ``serve --screenshots`` (default ``auto``: when its
    worker has a vision projector and the screen lists few controls).

    Raises ``ValueError`` for text that is neither or a bad screenshot, ``TypeError`` for other
    types.
    """
    shot = screenshot_bytes(screenshot)
    if isinstance(screen, agent_pb2.Observation):
        if shot:
            obs = agent_pb2.Observation()
            obs.CopyFrom(screen)
            obs.screenshot_png = shot
            return obs
        return screen
    if isinstance(screen, bytes):
        screen = screen.decode("utf-8")
    if isinstance(screen, (list, tuple)):
        return agent_pb2.Observation(ui_elements_json=elements_to_json(screen), foreground_app=foreground_app,
                                     screenshot_png=shot)
    if isinstance(screen, str):
        head = screen.lstrip()[:1]
        if head in ("[", "{"):
            return agent_pb2.Observation(ui_elements_json=screen, foreground_app=foreground_app, screenshot_png=shot)
        if head == "<":
            return agent_pb2.Observation(uiautomator_xml=screen, foreground_app=foreground_app, screenshot_png=shot)
        raise ValueError(f"screen text is neither UI-element JSON nor uiautomator XML: {screen[:40]!r}")
    raise TypeError(f"cannot make an observation from {type(screen).__name__}")


def _event(ev: "agent_pb2.StepEvent") -> Optional[Event]:
    kind = ev.WhichOneof("event")
    if kind == "token":
        return Token(ev.token.step, ev.token.text, ev.token.index)
    if kind == "result":
        return StepResult.from_proto(ev.result)
    return None


def collect(events: Iterable[Event], on_token: Optional[Callable[[Token], None]] = None) -> StepResult:
    """Consumes a step's events, calling ``on_token`` per token; returns its result.

    Raises ``RuntimeError`` when the events end without a result.
    """
    for ev in events:
        if isinstance(ev, Token):
            if on_token is not None:
                on_token(ev)
        elif isinstance(ev, StepResult):
            return ev
    raise RuntimeError("the step's event stream ended without a StepResult")


class Episode:
    """One ``RunEpisode`` stream. Send an observation per step with :meth:`stream` (events) or
    :meth:`step` (the result); :meth:`close` ends the stream. Not thread-safe: one step at a
    time, as the gateway runs them.
    """

    _END = object()

    def __init__(self, stub: "agent_pb2_grpc.AgentServiceStub", task: str, episode_id: str, max_tokens: int,
                 timeout_s: Optional[float]):
        self.task = task
        self._inputs: "queue.Queue[Any]" = queue.Queue()
        self._inputs.put(agent_pb2.EpisodeInput(start=agent_pb2.EpisodeStart(episode_id=episode_id, task=task, max_tokens=max_tokens)))
        self._responses = stub.RunEpisode(iter(self._inputs.get, self._END), timeout=timeout_s)
        self._closed = False
        self._lock = threading.Lock()
        #: The episode id the gateway reports (set after the first step).
        self.episode_id = episode_id

    def stream(self, screen: ObservationLike, foreground_app: str = "",
               screenshot: Optional[ScreenshotLike] = None) -> Iterator[Event]:
        """Sends one observation (with ``screenshot``, see :func:`make_observation`) and yields
        its ``Token`` events as they arrive, then its ``StepResult``. Raises ``grpc.RpcError``
        when the stream fails, ``RuntimeError`` after :meth:`close`.
        """
        obs = make_observation(screen, foreground_app, screenshot)
        with self._lock:
            if self._closed:
                raise RuntimeError("episode is closed")
            self._inputs.put(agent_pb2.EpisodeInput(observation=obs))
            for raw in self._responses:
                ev = _event(raw)
                if ev is None:
                    continue
                if isinstance(ev, StepResult):
                    self.episode_id = ev.episode_id
                yield ev
                if isinstance(ev, StepResult):
                    return
            raise RuntimeError("the gateway closed the episode stream before the step's result")

    def step(self, screen: ObservationLike, foreground_app: str = "",
             on_token: Optional[Callable[[Token], None]] = None,
             screenshot: Optional[ScreenshotLike] = None) -> StepResult:
        """One step: sends ``screen`` (and ``screenshot``), calls ``on_token`` per streamed
        token, returns the result."""
        return collect(self.stream(screen, foreground_app, screenshot), on_token)

    def close(self) -> None:
        """Ends the episode stream (idempotent)."""
        if not self._closed:
            self._closed = True
            self._inputs.put(self._END)
            self._responses.cancel()

    def __enter__(self) -> "Episode":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call (a gateway started with
    ``--auth-token-file``)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = list(details.metadata or []) + [self._header]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                          "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    """Call details with the token added (grpc's documented interceptor pattern)."""


def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _channel(target: str, tls_ca: Optional[str], tls_cert: Optional[str], tls_key: Optional[str]) -> grpc.Channel:
    """A plaintext channel, or a TLS one with ``tls_ca`` (and the client pair for mutual TLS).
    Raises ``ValueError`` for a client certificate without its key (or without ``tls_ca``)."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together")
    if tls_ca is None:
        if tls_cert is not None:
            raise ValueError("tls_cert needs tls_ca (the gateway's CA)")
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca), private_key=_read(tls_key),
                                         certificate_chain=_read(tls_cert))
    return grpc.secure_channel(target, creds)


def read_token_file(path: str) -> str:
    """The first token of a token file (one per line, ``#`` comments), as the servers'
    ``--auth-token-file`` reads it. Raises ``ValueError`` for a file without a token."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            t = line.strip()
            if t and not t.startswith("#"):
                return t
    raise ValueError(f"{path}: no token (one token per line; # starts a comment)")


class AgentClient:
    """Client of a gateway's ``AgentService`` at ``target`` (``host:port``; default
    :data:`DEFAULT_TARGET`), or over an existing ``channel``. ``timeout_s``: deadline per call
    (None: none). ``token``: the bearer token of a gateway started with
    ``--auth-token-file`` (``token_file``: read it from such a file); without one a gateway
    that requires a token answers ``UNAUTHENTICATED``. ``tls_ca``: path of the PEM CA
    certificate(s) of a gateway started with ``--tls-cert`` (TLS on; the target's host must be
    a name in its certificate); ``tls_cert``/``tls_key``: PEM client certificate and key for a
    gateway with ``--tls-client-ca`` (mutual TLS).
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, channel: Optional[grpc.Channel] = None,
                 timeout_s: Optional[float] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None):
        self.target = target
        self._own_channel = channel is None
        if channel is None:
            channel = _channel(target, tls_ca, tls_cert, tls_key)
        self.channel = channel
        if token is None and token_file is not None:
            token = read_token_file(token_file)
        if token is not None:
            self.channel = grpc.intercept_channel(self.channel, _BearerToken(token))
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.timeout_s = timeout_s

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Blocks until the channel is connected; raises ``grpc.FutureTimeoutError`` after
        ``timeout_s`` seconds."""
        grpc.channel_ready_future(self.channel).result(timeout=timeout_s)

    def step(self, screen: ObservationLike, *, task: str, episode_id: str = "", max_tokens: int = 0,
             foreground_app: str = "", screenshot: Optional[ScreenshotLike] = None) -> Iterator[Event]:
        """``AgentService.Step``: yields the step's ``Token`` events as the gateway streams them,
        then its ``StepResult``. The gateway keeps the history of ``episode_id`` across calls
        (``""``: a new episode). ``screenshot``: PNG/JPEG bytes or RGB pixels (see
        :func:`make_observation`); ``result.stats["screenshot_sent"]`` says whether the model
        saw it. Raises ``grpc.RpcError`` (``INVALID_ARGUMENT`` for a screen that cannot be
        parsed, a screenshot the worker cannot decode, or a prompt over the worker's context
        (or ``max_tokens`` past its end); ``FAILED_PRECONDITION`` for a
        screenshot under ``--screenshots always`` when the worker has no vision projector).
        """
        req = agent_pb2.StepRequest(episode_id=episode_id, task=task, max_tokens=max_tokens,
                                    observation=make_observation(screen, foreground_app, screenshot))
        for raw in self.stub.Step(req, timeout=self.timeout_s):
            ev = _event(raw)
            if ev is not None:
                yield ev

    def run_episode(self, task: str, *, episode_id: str = "", max_tokens: int = 0) -> Episode:
        """Opens an ``AgentService.RunEpisode`` stream for ``task`` (``episode_id`` ``""``: the
        gateway makes one; ``max_tokens`` 0: gateway default). Use the returned
        :class:`Episode` as a context manager."""
        return Episode(self.stub, task, episode_id, max_tokens, self.timeout_s)

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
