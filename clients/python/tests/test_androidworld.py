"""The AndroidWorld adapter against a real gateway and worker, with a stand-in environment that
feeds the screens of a corpus AndroidWorld episode as UIElement dataclasses."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import pytest

from conftest import load_androidworld_episode
from tandem_client import AgentClient, elements_to_json
from tandem_client.androidworld import JSONAction, TandemAgent, to_json_action


# Mirrors of android_world.env.representation_utils.BoundingBox / UIElement (field names and
# types), as AndroidWorld's env.get_state().ui_elements holds them.
@dataclasses.dataclass
class BoundingBox:
    x_min: float
    x_max: float
    y_min: float
    y_max: float


@dataclasses.dataclass
class UIElement:
    text: Optional[str] = None
    content_description: Optional[str] = None
    class_name: Optional[str] = None
    bbox: Optional[BoundingBox] = None
    bbox_pixels: Optional[BoundingBox] = None
    hint_text: Optional[str] = None
    is_checked: Optional[bool] = None
    is_checkable: Optional[bool] = None
    is_clickable: Optional[bool] = None
    is_editable: Optional[bool] = None
    is_enabled: Optional[bool] = None
    is_focused: Optional[bool] = None
    is_focusable: Optional[bool] = None
    is_long_clickable: Optional[bool] = None
    is_scrollable: Optional[bool] = None
    is_selected: Optional[bool] = None
    is_visible: Optional[bool] = None
    package_name: Optional[str] = None
    resource_name: Optional[str] = None
    tooltip: Optional[str] = None
    resource_id: Optional[str] = None
    metadata: Optional[Any] = None


def to_element(d: dict) -> UIElement:
    fields = {f.name for f in dataclasses.fields(UIElement)}
    kw = {k: v for k, v in d.items() if k in fields}
    for box in ("bbox", "bbox_pixels"):
        if isinstance(kw.get(box), dict):
            kw[box] = BoundingBox(**kw[box])
    return UIElement(**kw)


@dataclasses.dataclass
class State:
    ui_elements: list


class CorpusEnv:
    """Stand-in for AndroidWorld's AsyncEnv: each get_state() returns the next recorded screen."""

    def __init__(self, screens: list[list[dict]]):
        self.screens = [[to_element(e) for e in s] for s in screens]
        self.cursor = 0
        self.executed: list[tuple[int, JSONAction]] = []
        self.resets = 0

    def reset(self, go_home: bool = False) -> None:
        self.resets += 1
        self.cursor = 0

    def get_state(self, wait_to_stabilize: bool = False) -> State:
        return State(ui_elements=self.screens[min(self.cursor, len(self.screens) - 1)])

    def execute_action(self, action: JSONAction) -> None:
        self.executed.append((self.cursor, action))
        self.cursor += 1


def test_elements_serialise_like_androidworld_json():
    el = UIElement(text="Phone", class_name="android.widget.TextView", bbox_pixels=BoundingBox(1, 2, 3, 4), is_clickable=True)
    (d,) = json.loads(elements_to_json([el]))
    assert d["bbox_pixels"] == {"x_min": 1, "x_max": 2, "y_min": 3, "y_max": 4}
    assert d["text"] == "Phone" and d["is_clickable"] is True and d["hint_text"] is None


def test_to_json_action_maps_gateway_actions():
    a = to_json_action({"action_type": "click", "index": 3})
    assert (a.action_type, a.index, a.x) == ("click", 3, None)
    s = to_json_action({"action_type": "status", "goal_status": "complete"})
    assert s.goal_status == "complete"
    with pytest.raises(ValueError):
        to_json_action({"action_type": "fly"})


def test_agent_runs_a_corpus_episode_end_to_end(servers):
    goal, screens = load_androidworld_episode()
    env = CorpusEnv(screens[:4])
    tokens = []
    agent = TandemAgent(env, client=AgentClient(servers.grpc_target, timeout_s=300), transition_pause=0,
                        on_token=tokens.append)
    agent.reset(go_home=True)
    assert env.resets == 1
    results = []
    for _ in range(3):
        r = agent.step(goal)
        results.append(r)
        if r.done:
            break
    agent.close()
    assert tokens, "tokens were streamed to the agent"
    for i, r in enumerate(results):
        d = r.data
        assert d["error"] == "", d
        assert d["step"] == i and d["goal"] == goal
        assert isinstance(d["json_action"], JSONAction)
        assert d["first_token_s"] is not None and d["first_token_s"] <= d["step_s"]
        assert d["n_ui_elements"] == len(env.screens[min(i, len(env.screens) - 1)])
    if i >= 1:
        assert results[1].data["stats"]["reused_tokens"] > 0
    # Every non-status action was executed on the screen it was chosen for, and an index names
    # an element of that screen.
    executed = {cursor: a for cursor, a in env.executed}
    for i, r in enumerate(results):
        action = r.data["json_action"]
        if action.action_type == "status":
            assert r.done and i not in executed
            continue
        assert executed[i] == action
        if action.index is not None:
            assert 0 <= action.index < len(env.screens[i])
    assert len({r.data["episode_id"] for r in results}) == 1
