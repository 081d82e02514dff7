"""An AndroidWorld agent backed by the tandem agent-gateway.

:class:`TandemAgent` has AndroidWorld's agent interface
(``android_world.agents.base_agent.EnvironmentInteractingAgent``: ``step(goal) ->
AgentInteractionResult(done, data)``, ``reset(go_home)``). Each step it reads the
accessibility elements of ``env.get_state().ui_elements``, sends them to the gateway on the
episode's ``RunEpisode`` stream with the screenshot (``State.pixels``, PNG-encoded; the
gateway's ``serve --screenshots`` decides whether the model sees it), and turns the returned
JSON action into a ``JSONAction`` for ``env.execute_action``. A ``status`` action ends the
episode (it is not executed).

Actions: android_world's fourteen types (``json_action._ACTION_TYPES``: click, double_tap,
long_press, input_text, scroll, swipe, navigate_back, navigate_home, open_app,
keyboard_enter, wait, status, answer, unknown) with its fields (``index`` or ``x``/``y``,
``text``, ``direction``, ``app_name``, ``goal_status``, ``keycode``, ``clear_text``).
``keyboard_enter`` with a ``keycode`` other than ``KEYCODE_ENTER`` (D-pad and other keys of TV
screens) presses that key (see :func:`execute`), since android_world's actuation presses Enter
for ``keyboard_enter`` whatever the keycode.

With AndroidWorld installed (``android_world`` importable) the real base class, ``JSONAction``
and ``AgentInteractionResult`` are used; without it, the stand-ins below with the same fields
and behaviour, so the adapter runs against any object with ``get_state()`` /
``execute_action()`` / ``reset()``. Interface source: google-research/android_world,
``android_world/agents/base_agent.py`` and ``android_world/env/json_action.py``.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, Callable, Optional

from tandem_client.client import DEFAULT_TARGET, AgentClient, Episode, StepResult, Token, encode_png

try:  # pragma: no cover - depends on the environment
    from android_world.agents import base_agent as _base_agent
    from android_world.env import json_action as _json_action

    HAVE_ANDROID_WORLD = True
    EnvironmentInteractingAgent = _base_agent.EnvironmentInteractingAgent
    AgentInteractionResult = _base_agent.AgentInteractionResult
    JSONAction = _json_action.JSONAction
except ImportError:
    HAVE_ANDROID_WORLD = False

    #: AndroidWorld's action types (``json_action._ACTION_TYPES``).
    ACTION_TYPES = ("click", "double_tap", "scroll", "swipe", "input_text", "navigate_home", "navigate_back",
                    "keyboard_enter", "open_app", "status", "wait", "long_press", "answer", "unknown")

    @dataclasses.dataclass
    class AgentInteractionResult:  # type: ignore[no-redef]
        """Stand-in for ``base_agent.AgentInteractionResult``: ``done`` ends the episode,
        ``data`` holds the step's agent data."""

        done: bool
        data: dict

    @dataclasses.dataclass
    class JSONAction:  # type: ignore[no-redef]
        """Stand-in for ``json_action.JSONAction`` (same fields; validates the action type,
        index/coordinate exclusivity, the scroll direction and the ``KEYCODE_`` prefix, and
        turns a non-string ``text`` into a string, like the original)."""

        action_type: Optional[str] = None
        index: Optional[int] = None
        x: Optional[int] = None
        y: Optional[int] = None
        text: Optional[str] = None
        direction: Optional[str] = None
        goal_status: Optional[str] = None
        app_name: Optional[str] = None
        keycode: Optional[str] = None
        clear_text: Optional[bool] = None

        def __post_init__(self) -> None:
            if self.action_type not in ACTION_TYPES:
                raise ValueError(f"Invalid action type: {self.action_type}")
            if self.index is not None:
                self.index = int(self.index)
                if self.x is not None or self.y is not None:
                    raise ValueError("Either an index or a <x, y> should be provided.")
            if self.direction and self.direction not in ("left", "right", "down", "up"):
                raise ValueError(f"Invalid scroll direction: {self.direction}")
            if self.text is not None and not isinstance(self.text, str):
                self.text = str(self.text)
            if self.keycode is not None and not self.keycode.startswith("KEYCODE_"):
                raise ValueError(f"Invalid keycode: {self.keycode}")

        def as_dict(self, skip_none: bool = True) -> dict:
            return {k: v for k, v in dataclasses.asdict(self).items() if not (skip_none and v is None)}

    class EnvironmentInteractingAgent(abc.ABC):  # type: ignore[no-redef]
        """Stand-in for ``base_agent.EnvironmentInteractingAgent``."""

        def __init__(self, env: Any, name: str = "", transition_pause: Optional[float] = 1.0):
            if transition_pause is not None and transition_pause < 0:
                raise ValueError(f"transition_pause must be non-negative, got {transition_pause}")
            self._env = env
            self._name = name
            self._transition_pause = transition_pause
            self._max_steps: Optional[int] = None

        @property
        def env(self) -> Any:
            return self._env

        @property
        def name(self) -> str:
            return self._name

        def set_max_steps(self, max_steps: int) -> None:
            self._max_steps = max_steps

        def reset(self, go_home: bool = False) -> None:
            self.env.reset(go_home=go_home)

        def get_post_transition_state(self) -> Any:
            if self._transition_pause is None:
                return self.env.get_state(wait_to_stabilize=True)
            time.sleep(self._transition_pause)
            return self.env.get_state(wait_to_stabilize=False)

        @abc.abstractmethod
        def step(self, goal: str) -> "AgentInteractionResult":
            """One step towards ``goal``."""


_ACTION_FIELDS = tuple(f.name for f in dataclasses.fields(JSONAction))


def to_json_action(action: dict) -> "JSONAction":
    """AndroidWorld's ``JSONAction`` for a gateway action dict (``{"action_type": "click",
    "index": 3}``); keys ``JSONAction`` has no field for are dropped. Raises ``ValueError`` for
    an action ``JSONAction`` rejects."""
    return JSONAction(**{k: v for k, v in action.items() if k in _ACTION_FIELDS and v is not None})


def _adb_press_key(env: Any, keycode: str) -> None:
    """Presses ``keycode`` on an AndroidWorld env through its controller
    (``adb_utils.press_keyboard_generic``). Raises ``RuntimeError`` without AndroidWorld or a
    ``controller``."""
    if not HAVE_ANDROID_WORLD or not hasattr(env, "controller"):
        raise RuntimeError(f"cannot press {keycode}: no AndroidWorld controller on the env; pass press_key= to TandemAgent")
    from android_world.env import adb_utils  # pragma: no cover - depends on the environment

    adb_utils.press_keyboard_generic(keycode, env.controller)  # pragma: no cover


def execute(env: Any, action: "JSONAction", press_key: Optional[Callable[[str], None]] = None) -> str:
    """Carries out one non-``status`` action on ``env`` and says how: ``"key"`` when a
    ``keyboard_enter`` names a keycode other than ``KEYCODE_ENTER`` (pressed with ``press_key``,
    default :func:`_adb_press_key` on ``env``), else ``"env"`` (``env.execute_action(action)``,
    which also handles ``unknown`` and ``answer``)."""
    if action.action_type == "keyboard_enter" and action.keycode not in (None, "KEYCODE_ENTER"):
        (press_key or (lambda k: _adb_press_key(env, k)))(action.keycode)
        return "key"
    env.execute_action(action)
    return "env"


class TandemAgent(EnvironmentInteractingAgent):
    """AndroidWorld agent whose actions come from a tandem gateway.

    ``env``: AndroidWorld ``AsyncEnv`` (or any object with ``get_state(wait_to_stabilize)``
    returning a state with ``ui_elements``, ``execute_action(JSONAction)`` and
    ``reset(go_home)``). ``client``: an :class:`AgentClient` (default: one for ``target``).
    ``max_tokens``: output budget per step (0: gateway default). ``on_token``: called with
    each streamed :class:`Token`. ``press_key``: presses a ``KEYCODE_...`` key for
    ``keyboard_enter`` actions that name one (default: AndroidWorld's adb on ``env.controller``).
    ``screenshots``: send ``state.pixels`` (an ``(height, width, 3)`` uint8 array, AndroidWorld's
    screenshot) PNG-encoded with each observation when the state has them (default True).

    ``step(goal)`` returns ``AgentInteractionResult(done, data)``; ``data`` holds ``goal``,
    ``episode_id``, ``step``, ``action`` (the dict), ``action_json``, ``raw_output``, ``error``,
    ``stats`` (the gateway's StepStats; ``stats["screenshot_sent"]``: the model saw the
    screenshot), ``screenshot_bytes`` (PNG bytes sent, 0 for none), ``n_ui_elements`` and
    ``first_token_s`` / ``step_s``
    (client-side seconds), and for an executed action ``json_action`` and ``executed_by``
    (``"env"`` or ``"key"``, see :func:`execute`). A step without a valid action executes
    nothing and is not done.
    """

    def __init__(self, env: Any, name: str = "tandem", *, client: Optional[AgentClient] = None,
                 target: str = DEFAULT_TARGET, max_tokens: int = 0, transition_pause: Optional[float] = 1.0,
                 on_token: Optional[Callable[[Token], None]] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, press_key: Optional[Callable[[str], None]] = None,
                 screenshots: bool = True):
        super().__init__(env, name, transition_pause)
        self.screenshots = screenshots
        self.client = client if client is not None else AgentClient(target, token=token, token_file=token_file)
        self.max_tokens = max_tokens
        self.on_token = on_token
        self.press_key = press_key
        self._episode: Optional[Episode] = None

    def reset(self, go_home: bool = False) -> None:
        """Resets the environment and starts a new gateway episode at the next step."""
        super().reset(go_home)
        self._end_episode()

    def _end_episode(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    def close(self) -> None:
        """Ends the gateway episode stream."""
        self._end_episode()

    def step(self, goal: str) -> "AgentInteractionResult":
        if self._episode is None or self._episode.task != goal:
            self._end_episode()
            self._episode = self.client.run_episode(goal, max_tokens=self.max_tokens)
        state = self.get_post_transition_state()
        elements = list(state.ui_elements)
        pixels = getattr(state, "pixels", None) if self.screenshots else None
        t0 = time.perf_counter()
        png = encode_png(pixels) if pixels is not None else None
        first_token_s: list[float] = []

        def on_token(tok: Token) -> None:
            if not first_token_s:
                first_token_s.append(time.perf_counter() - t0)
            if self.on_token is not None:
                self.on_token(tok)

        result: StepResult = self._episode.step(elements, on_token=on_token, screenshot=png)
        data: dict = {
            "goal": goal,
            "episode_id": result.episode_id,
            "step": result.step,
            "action": result.action,
            "action_json": result.action_json,
            "raw_output": result.raw_output,
            "error": result.error,
            "stats": result.stats,
            "screenshot_bytes": len(png) if png is not None else 0,
            "n_ui_elements": len(elements),
            "first_token_s": first_token_s[0] if first_token_s else None,
            "step_s": time.perf_counter() - t0,
        }
        if not result.ok:
            return AgentInteractionResult(False, data)
        action = to_json_action(result.action or {})
        data["json_action"] = action
        if action.action_type == "status":
            return AgentInteractionResult(True, data)
        data["executed_by"] = execute(self.env, action, self.press_key)
        return AgentInteractionResult(False, data)
