"""The AndroidWorld adapter against a real gateway and worker, with a stand-in environment that
feeds the screens of a corpus AndroidWorld episode as UIElement dataclasses."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import pytest

from conftest import load_androidworld_episode
from tandem_client import AgentClient, elements_to_json
from tandem_client.androidworld import JSONAction, TandemAgent, execute, to_json_action


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


# One gateway action of each of android_world's fourteen types, as the gateway writes them
# (agent-gateway Action::to_json: the schema's key order, only the fields each type uses).
EVERY_TYPE = [
    {"action_type": "click", "index": 3},
    {"action_type": "click", "x": 540, "y": 220},
    {"action_type": "double_tap", "index": 7},
    {"action_type": "long_press", "x": 1, "y": 2},
    {"action_type": "input_text", "text": "milk", "index": 3, "clear_text": True},
    {"action_type": "scroll", "direction": "down", "index": 5},
    {"action_type": "swipe", "direction": "up"},
    {"action_type": "navigate_back"},
    {"action_type": "navigate_home"},
    {"action_type": "open_app", "app_name": "Contacts"},
    {"action_type": "keyboard_enter"},
    {"action_type": "keyboard_enter", "keycode": "KEYCODE_DPAD_DOWN"},
    {"action_type": "wait"},
    {"action_type": "status", "goal_status": "complete"},
    {"action_type": "answer", "text": "It is 5 pm."},
    {"action_type": "unknown"},
]


def test_every_androidworld_action_type_maps_to_a_json_action():
    types = set()
    for d in EVERY_TYPE:
        a = to_json_action(d)
        types.add(a.action_type)
        # Every field the gateway sent arrives, unchanged, and nothing else is set.
        assert a.as_dict() == d
    assert len(types) == 14
    with pytest.raises(ValueError):
        to_json_action({"action_type": "keyboard_enter", "keycode": "DPAD_DOWN"})
    with pytest.raises(ValueError):
        to_json_action({"action_type": "click", "index": 1, "x": 2, "y": 3})
    assert to_json_action({"action_type": "input_text", "text": 5550100, "index": 1}).text == "5550100"


class RecordingEnv:
    """Records what reaches the environment."""

    def __init__(self):
        self.executed: list = []

    def execute_action(self, action: JSONAction) -> None:
        self.executed.append(action)


def test_keycodes_are_pressed_and_other_actions_go_to_the_env():
    env, pressed = RecordingEnv(), []
    for d in EVERY_TYPE:
        if d["action_type"] != "status":
            execute(env, to_json_action(d), press_key=pressed.append)
    assert pressed == ["KEYCODE_DPAD_DOWN"]
    assert len(env.executed) == len(EVERY_TYPE) - 2
    assert all(a.keycode is None for a in env.executed)
    assert execute(env, to_json_action({"action_type": "keyboard_enter", "keycode": "KEYCODE_ENTER"}), pressed.append) == "env"
    # Without a press_key and without an AndroidWorld controller, a key press is a clear error.
    with pytest.raises(RuntimeError, match="KEYCODE_DPAD_UP"):
        execute(env, to_json_action({"action_type": "keyboard_enter", "keycode": "KEYCODE_DPAD_UP"}))


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
