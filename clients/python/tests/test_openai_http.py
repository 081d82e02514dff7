"""The official `openai` package against the gateway's OpenAI-compatible endpoint, on the real
model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

SYSTEM = (
    "You are a phone assistant. You help users operate Android apps: opening apps, tapping "
    "buttons, typing text and scrolling lists. Always answer briefly and precisely."
)


@pytest.fixture(scope="module")
def client(servers):
    return openai.OpenAI(base_url=servers.openai_base, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    models = client.models.list().data
    assert models, "the gateway lists the worker's model"
    assert all(m.id for m in models)
    return models[0].id


def ask(client, model_id, content, **kw):
    return client.chat.completions.create(
        model=model_id, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}], **kw)


def test_chat_completion_is_greedy_at_temperature_zero(client, model_id):
    a = ask(client, model_id, "Name one app that shows the weather.", max_tokens=16, temperature=0)
    b = ask(client, model_id, "Name one app that shows the weather.", max_tokens=16, temperature=0)
    text = a.choices[0].message.content
    assert isinstance(text, str) and text.strip(), a
    assert a.choices[0].message.role == "assistant"
    assert a.choices[0].finish_reason in ("stop", "length")
    assert 1 <= a.usage.completion_tokens <= 16
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens
    assert b.choices[0].message.content == text, "greedy decoding is deterministic"


def test_streaming_completion_matches_the_non_streaming_one(client, model_id):
    prompt = "Describe how to open the Settings app."
    whole = ask(client, model_id, prompt, max_tokens=24, temperature=0).choices[0].message.content
    chunks = list(ask(client, model_id, prompt, max_tokens=24, temperature=0, stream=True,
                      stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2, f"tokens arrive as separate chunks: {pieces}"
    assert "".join(pieces) == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [finishes[-1]] and finishes[-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= len(pieces)


def test_schema_constrained_completion_is_valid_json_of_the_schema(client, model_id):
    schema = {
        "type": "object",
        "properties": {
            "action_type": {"type": "string", "enum": ["click", "scroll"]},
            "index": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["action_type", "index"],
        "additionalProperties": False,
    }
    r = ask(client, model_id, "Screen: [0] Button 'Phone' [1] Button 'Contacts'. Open Contacts. Reply with JSON.",
            max_tokens=48, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "action", "schema": schema, "strict": True}})
    action = json.loads(r.choices[0].message.content)
    assert set(action) == {"action_type", "index"}, action
    assert action["action_type"] in ("click", "scroll")
    assert isinstance(action["index"], int) and 0 <= action["index"] <= 9


def test_stop_string_ends_the_output_before_it(client, model_id):
    prompt = "List three fruits, one per line."
    free = ask(client, model_id, prompt, max_tokens=40, temperature=0).choices[0].message.content
    assert "\n" in free.strip(), f"precondition: the free answer has several lines: {free!r}"
    r = ask(client, model_id, prompt, max_tokens=40, temperature=0, stop=["\n"])
    assert r.choices[0].message.content == free.split("\n")[0]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       ask(client, model_id, prompt, max_tokens=40, temperature=0, stop=["\n"], stream=True) if c.choices)
    assert streamed == free.split("\n")[0]


@pytest.mark.parametrize("how", ["header", "user"])
def test_requests_of_one_episode_reuse_the_prompt_prefix(client, model_id, how):
    episode = f"py-reuse-{how}"
    kw = {"extra_headers": {"X-Episode-Id": episode}} if how == "header" else {"user": episode}
    first = ask(client, model_id, "Step 1: the screen shows the home screen.", max_tokens=4, **kw)
    second = ask(client, model_id, "Step 2: the screen shows the app drawer.", max_tokens=4, **kw)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0, second.usage
    assert cached < second.usage.prompt_tokens
    # The shared system prompt alone is dozens of tokens.
    assert cached >= 20, second.usage
    assert first.choices[0].message.content is not None


def test_errors_use_openai_error_json(client, model_id, servers):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=[])
    assert e.value.status_code == 400
    assert e.value.body["param"] == "messages" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, model_id, "hi", temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(urllib.error.HTTPError) as h:
        urllib.request.urlopen(servers.http_base + "/v1/embeddings")
    assert h.value.code == 404
    assert json.loads(h.value.read())["error"]["type"] == "invalid_request_error"


def test_health_reports_the_worker(servers):
    with urllib.request.urlopen(servers.http_base + "/health") as r:
        body = json.loads(r.read())
    assert body["status"] == "ok"
    assert [w["ok"] for w in body["workers"]] == [True]
