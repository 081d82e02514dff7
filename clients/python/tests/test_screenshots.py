"""Screenshots from the Python client and the AndroidWorld adapter (issue 19): PNG encoding of
RGB pixels without numpy/Pillow, and steps through a real gateway (``--screenshots always``)
and a real worker on the tiny Qwen3.5-VL fixture with its projector."""

from __future__ import annotations

import dataclasses
import struct
import zlib

import grpc
import pytest

from conftest import VL_IMAGE_MAX_TOKENS, corpus_root, load_androidworld_episode
from tandem_client import AgentClient, StepResult, encode_png, make_observation, screenshot_bytes
from tandem_client.androidworld import TandemAgent


class Pixels:
    """A stand-in for AndroidWorld's ``State.pixels`` (a numpy uint8 array): ``shape``,
    ``dtype`` and row-major ``tobytes()``, a colour gradient."""

    def __init__(self, height: int, width: int, channels: int = 3):
        self.shape = (height, width, channels)
        self.dtype = "uint8"
        self._bytes = bytes((x * 7 + y * 3 + c * 50) & 255 for y in range(height) for x in range(width) for c in range(channels))

    def tobytes(self) -> bytes:
        return self._bytes


def read_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, color type, unfiltered pixel bytes) of an 8-bit PNG without filters,
    checking the signature and every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    w, h, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = w * (3 if color == 2 else 4)
    rows = [raw[y * (stride + 1):(y + 1) * (stride + 1)] for y in range(h)]
    assert all(r[0] == 0 for r in rows), "filter type 0 on every row"
    return w, h, color, b"".join(r[1:] for r in rows)


def test_encode_png_round_trips_pixels():
    for channels, color in ((3, 2), (4, 6)):
        px = Pixels(5, 7, channels)
        w, h, c, body = read_png(encode_png(px))
        assert (w, h, c) == (7, 5, color)
        assert body == px.tobytes()


def test_bad_screenshots_are_refused_before_sending():
    with pytest.raises(ValueError, match="neither PNG nor JPEG"):
        screenshot_bytes(b"GIF89a....")
    bad = Pixels(2, 2)
    bad.shape = (2, 2)
    with pytest.raises(ValueError, match="shape"):
        encode_png(bad)
    assert screenshot_bytes(None) == b""
    png = encode_png(Pixels(2, 3))
    assert screenshot_bytes(png) == png
    obs = make_observation("<hierarchy/>", screenshot=Pixels(2, 3))
    assert obs.screenshot_png == png and obs.uiautomator_xml == "<hierarchy/>"


def trace_18(name: str) -> bytes:
    return (corpus_root() / "llamatouch_evaluator/trace_18" / name).read_bytes()


def result_of(events) -> StepResult:
    (r,) = [ev for ev in events if isinstance(ev, StepResult)]
    return r


def test_a_corpus_screenshot_reaches_the_model(vl_servers):
    xml = trace_18("0.xml").decode("utf-8", "replace")
    shot = trace_18("0.png")
    with AgentClient(vl_servers.grpc_target, timeout_s=300) as c:
        r1 = result_of(c.step(xml, task="Turn on Wi-Fi", episode_id="py-shot", max_tokens=12, screenshot=shot))
        assert r1.stats["screenshot_sent"] and 0 < r1.stats["image_tokens"] <= VL_IMAGE_MAX_TOKENS, r1
        assert (r1.stats["images_encoded"], r1.stats["image_cache_hits"]) == (1, 0), r1
        # Another screen's text with the same screenshot: its embeddings come from the cache.
        xml2 = trace_18("1.xml").decode("utf-8", "replace")
        r2 = result_of(c.step(xml2, task="Turn on Wi-Fi", episode_id="py-shot", max_tokens=12, screenshot=shot))
        assert r2.stats["image_tokens"] == r1.stats["image_tokens"]
        assert (r2.stats["images_encoded"], r2.stats["image_cache_hits"]) == (0, 1), r2
        # A truncated PNG: the worker cannot decode it; the error names the observation and
        # the gateway keeps serving.
        with pytest.raises(grpc.RpcError) as e:
            result_of(c.step(xml, task="Turn on Wi-Fi", episode_id="py-bad", max_tokens=12, screenshot=shot[:2000]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("observation.screenshot_png: "), e.value.details()
        r3 = result_of(c.step(xml, task="Turn on Wi-Fi", episode_id="py-bad", max_tokens=12, screenshot=shot))
        assert r3.stats["screenshot_sent"], r3


@dataclasses.dataclass
class State:
    ui_elements: list
    pixels: object = None


class PixelEnv:
    """A stand-in AndroidWorld env: a corpus screen's UI elements with 256×256 pixels."""

    def __init__(self, elements: list):
        self.elements = elements
        self.pixels = Pixels(256, 256)
        self.executed: list = []

    def reset(self, go_home: bool = False) -> None:
        pass

    def get_state(self, wait_to_stabilize: bool = False) -> State:
        return State(ui_elements=self.elements, pixels=self.pixels)

    def execute_action(self, action) -> None:
        self.executed.append(action)


def test_the_androidworld_agent_sends_the_state_pixels(vl_servers):
    goal, screens = load_androidworld_episode()
    env = PixelEnv(screens[0])
    agent = TandemAgent(env, client=AgentClient(vl_servers.grpc_target, timeout_s=300), transition_pause=0, max_tokens=12)
    d = agent.step(goal).data
    agent.close()
    assert d["screenshot_bytes"] > 0
    assert d["stats"]["screenshot_sent"], d
    # 256×256 px are 8×8 blocks of 32 px, within the worker's token budget: not resized.
    assert d["stats"]["image_tokens"] == (256 // 32) * (256 // 32), d
    # Without screenshots the same step is text-only.
    agent = TandemAgent(env, client=AgentClient(vl_servers.grpc_target, timeout_s=300), transition_pause=0, max_tokens=12,
                        screenshots=False)
    d = agent.step(goal).data
    agent.close()
    assert d["screenshot_bytes"] == 0 and not d["stats"]["screenshot_sent"] and d["stats"]["image_tokens"] == 0, d
