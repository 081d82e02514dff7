"""AgentClient against a real gateway and worker, on corpus screens."""

from __future__ import annotations

import time

import grpc
import pytest

from conftest import load_androidworld_episode
from tandem_client import AgentClient, StepResult, Token, make_observation

ACTION_TYPES = {"click", "long_press", "input_text", "scroll", "open_app", "status", "answer",
                "navigate_back", "navigate_home", "keyboard_enter", "wait"}


@pytest.fixture(scope="module")
def agent(servers):
    with AgentClient(servers.grpc_target, timeout_s=300) as c:
        c.wait_ready(30)
        yield c


def test_step_streams_tokens_before_the_result(agent):
    goal, screens = load_androidworld_episode()
    t0 = time.perf_counter()
    arrivals: list[tuple[float, object]] = [(time.perf_counter() - t0, ev)
                                            for ev in agent.step(screens[0], task=goal, episode_id="py-step")]
    tokens = [(t, ev) for t, ev in arrivals if isinstance(ev, Token)]
    (t_result, result), = [(t, ev) for t, ev in arrivals if isinstance(ev, StepResult)]
    assert arrivals[-1][1] is result
    assert len(tokens) >= 3
    assert [ev.index for _, ev in tokens] == list(range(len(tokens)))
    assert result.ok, result
    assert "".join(ev.text for _, ev in tokens) == result.raw_output
    assert result.action["action_type"] in ACTION_TYPES
    # The first token reaches us while the step is still decoding.
    assert tokens[0][0] < t_result
    assert result.stats["decode_tokens"] >= len(tokens)


def test_run_episode_runs_corpus_steps_and_reuses_the_slot(agent):
    goal, screens = load_androidworld_episode()
    results = []
    with agent.run_episode(goal, episode_id="py-episode") as ep:
        for screen in screens[:3]:
            seen: list[Token] = []
            results.append(ep.step(screen, on_token=seen.append))
            assert seen, "tokens are streamed"
    assert [r.step for r in results] == [0, 1, 2]
    assert all(r.episode_id == "py-episode" for r in results)
    for r in results:
        assert r.ok, r
        assert r.action["action_type"] in ACTION_TYPES
    assert results[1].stats["reused_tokens"] > 0 and results[2].stats["reused_tokens"] > 0


def test_a_bad_screen_is_invalid_argument(agent):
    with pytest.raises(grpc.RpcError) as e:
        list(agent.step("<hierarchy><node text='a'", task="open settings"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_make_observation_picks_the_screen_kind():
    assert make_observation("<hierarchy/>").WhichOneof("screen") == "uiautomator_xml"
    assert make_observation('[{"text": "a"}]').WhichOneof("screen") == "ui_elements_json"
    assert make_observation([{"text": "a"}], "com.x").foreground_app == "com.x"
    with pytest.raises(ValueError):
        make_observation("plain words")
    with pytest.raises(TypeError):
        make_observation(42)
