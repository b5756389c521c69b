"""Provider wire formats: golden requests, and generated conversations checked by validators
that encode each provider's rules independently of the formatters."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.formats import (
    CONTINUATION_NOTE,
    openai_request_tokens,
    responses_document,
    to_anthropic,
    to_neutral,
    to_openai,
    to_openai_responses,
)
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.tokens import HeuristicCounter, request_tokens
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.documents import PDF_PART, TEXT_PART
from tests.images import PNG_URL, data_url, jpeg

Json = dict[str, Any]

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def weather_flow() -> list[Message]:
    return [
        Message("system", "You are a weather bot."),
        Message("user", "Weather in Paris and Rome?"),
        Message(
            "assistant",
            "",
            tool_calls=(
                ToolCall("call_1", "get_weather", {"city": "Paris"}),
                ToolCall("call_2", "get_weather", {"city": "Rome"}),
            ),
        ),
        Message("tool", "18C, sunny", tool_call_id="call_1"),
        Message("tool", "station offline", tool_call_id="call_2", is_error=True),
        Message("assistant", "Paris: 18C and sunny. Rome: unknown."),
    ]


# --- golden requests ---------------------------------------------------------------------


def test_openai_weather_flow() -> None:
    assert to_openai(weather_flow(), [WEATHER]) == {
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "station offline"},
            {"role": "assistant", "content": "Paris: 18C and sunny. Rome: unknown."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": {
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                        "type": "object",
                    },
                },
            }
        ],
    }


def test_anthropic_weather_flow() -> None:
    assert to_anthropic(weather_flow(), [WEATHER]) == {
        "system": [{"type": "text", "text": "You are a weather bot."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "call_2",
                        "name": "get_weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C, sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2",
                        "content": "station offline",
                        "is_error": True,
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Paris: 18C and sunny. Rome: unknown."}],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "input_schema": {
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "type": "object",
                },
            }
        ],
    }


def test_neutral_weather_flow() -> None:
    request = to_neutral(weather_flow(), [WEATHER])
    assert request["messages"][2:5] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}},
                {"id": "call_2", "name": "get_weather", "arguments": {"city": "Rome"}},
            ],
        },
        {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"},
        {
            "role": "tool",
            "content": "station offline",
            "tool_call_id": "call_2",
            "is_error": True,
        },
    ]
    assert request["messages"][0] == {"role": "system", "content": "You are a weather bot."}
    assert request["tools"] == [
        {"name": WEATHER.name, "description": WEATHER.description, "parameters": WEATHER.parameters}
    ]
    assert to_neutral([Message("user", IMAGE_PARTS, name="ann")], []) == {
        "messages": [{"role": "user", "content": list(IMAGE_PARTS), "name": "ann"}]
    }


def test_golden_requests_are_valid() -> None:
    assert validate_openai(to_openai(weather_flow(), [WEATHER])) == []
    assert validate_anthropic(to_anthropic(weather_flow(), [WEATHER])) == []


def test_no_tools_no_system_keys() -> None:
    messages = [Message("user", "hi")]
    assert to_openai(messages, []) == {"messages": [{"role": "user", "content": "hi"}]}
    assert to_anthropic(messages, []) == {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    }


def test_openai_names_and_assistant_text_with_calls() -> None:
    messages = [
        Message("user", "hi", name="ann"),
        Message("assistant", "Checking.", tool_calls=(ToolCall("c1", "f", {}),)),
    ]
    assert to_openai(messages, [])["messages"] == [
        {"role": "user", "content": "hi", "name": "ann"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]


# --- Anthropic merging, system notes, images ----------------------------------------------


def test_anthropic_merges_consecutive_user_messages() -> None:
    request = to_anthropic([Message("user", "one"), Message("user", "two")], [])
    assert request["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]


def test_anthropic_puts_tool_results_before_user_text() -> None:
    messages = [
        Message("user", "go"),
        Message("assistant", "", tool_calls=(ToolCall("a", "f", {}), ToolCall("b", "f", {}))),
        Message("tool", "ra", tool_call_id="a"),
        Message("user", "and hurry"),
        Message("tool", "rb", tool_call_id="b"),
    ]
    request = to_anthropic(messages, [])
    assert request["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "ra"},
            {"type": "tool_result", "tool_use_id": "b", "content": "rb"},
            {"type": "text", "text": "and hurry"},
        ],
    }
    assert validate_anthropic(request) == []


def test_mid_conversation_system_becomes_a_user_note() -> None:
    messages = [
        Message("system", "Be brief."),
        Message("system", "Use metric units."),
        Message("user", "hi"),
        Message("assistant", "hello"),
        Message("system", "The user is on mobile."),
    ]
    request = to_anthropic(messages, [])
    assert request["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use metric units."},
    ]
    assert request["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "System note: The user is on mobile."}],
    }
    assert validate_anthropic(request) == []


def test_a_note_between_calls_and_results_goes_after_the_results() -> None:
    messages = [
        Message("user", "go"),
        Message("assistant", "", tool_calls=(ToolCall("a", "f", {}),)),
        Message("system", "note"),
        Message("tool", "ra", tool_call_id="a"),
    ]
    request = to_anthropic(messages, [])
    assert [b["type"] for b in request["messages"][2]["content"]] == ["tool_result", "text"]
    assert validate_anthropic(request) == []


def test_empty_text_is_dropped_and_an_empty_message_gets_a_placeholder() -> None:
    messages = [
        Message("system", "  "),
        Message("user", ({"type": "text", "text": ""}, {"type": "text", "text": "hi"})),
        Message("assistant", ""),
        Message("user", "?"),
    ]
    request = to_anthropic(messages, [])
    assert "system" not in request
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "(empty)"}]},
        {"role": "user", "content": [{"type": "text", "text": "?"}]},
    ]


IMAGE_PARTS = (
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "url": "https://example.com/cat.png", "detail": "low"},
    {"type": "image_url", "url": PNG_URL},
)


def test_images_openai() -> None:
    assert to_openai([Message("user", IMAGE_PARTS)], [])["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image_url",
            "image_url": {"url": "https://example.com/cat.png", "detail": "low"},
        },
        {"type": "image_url", "image_url": {"url": PNG_URL}},
    ]


def test_images_anthropic() -> None:
    assert to_anthropic([Message("user", IMAGE_PARTS)], [])["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": PNG_URL.partition(",")[2],
            },
        },
    ]


def test_documents_openai() -> None:
    content = (_text("Summarize"), PDF_PART, TEXT_PART)
    assert to_openai([Message("user", content)], [])["messages"][0]["content"] == [
        _text("Summarize"),
        {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF_PART["url"]}},
        _text("notes.txt:\n\nQuarterly notes: revenue up 4%."),
    ]


def test_documents_for_the_responses_api() -> None:
    assert responses_document(PDF_PART) == {
        "type": "input_file",
        "filename": "report.pdf",
        "file_data": PDF_PART["url"],
    }
    assert responses_document(TEXT_PART) == {
        "type": "input_text",
        "text": "notes.txt:\n\nQuarterly notes: revenue up 4%.",
    }
    # The Responses request carries them so (a ValueError before the two were wired).
    request = to_openai_responses([Message("user", (_text("Summarize"), PDF_PART))], [])
    assert request["input"][0]["content"][1] == responses_document(PDF_PART)


def test_documents_anthropic() -> None:
    content = (_text("Summarize"), PDF_PART, {"type": "document", "url": TEXT_PART["url"]})
    assert to_anthropic([Message("user", content)], [])["messages"][0]["content"] == [
        _text("Summarize"),
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": PDF_PART["url"].partition(",")[2],
            },
            "title": "report.pdf",
        },
        {
            "type": "document",
            "source": {
                "type": "text",
                "media_type": "text/plain",
                "data": "Quarterly notes: revenue up 4%.",
            },
            "title": "document.txt",
        },
    ]


def test_documents_are_counted_by_their_rule() -> None:
    class Words:
        name = "words"

        def count(self, text: str) -> int:
            return len(text.split())

    # priming 3; user 3+1; a two-page PDF 2 x 3000; "notes.txt:" and its five words
    messages = [Message("user", (PDF_PART, TEXT_PART))]
    assert request_tokens(messages, [], Words()) == 3 + 4 + 6000 + 6
    assert openai_request_tokens(to_openai(messages, []), Words()) == 3 + 4 + 6000 + 6


def test_the_validators_refuse_documents_the_providers_refuse() -> None:
    not_pdf = "data:application/pdf;base64," + PNG_URL.partition(",")[2]
    bad_file = {"type": "file", "file": {"filename": "a.pdf", "file_data": not_pdf}}
    unnamed = {"type": "file", "file": {"file_data": PDF_PART["url"]}}
    for part in (bad_file, unnamed):
        assert validate_openai({"messages": [{"role": "user", "content": [part]}]})
    assistant = {"role": "assistant", "content": [{"type": "file", "file": bad_file["file"]}]}
    assert validate_openai({"messages": [{"role": "user", "content": "x"}, assistant]})
    pdf_source = {"type": "base64", "media_type": "application/pdf"}
    for source in (
        {**pdf_source, "data": PNG_URL.partition(",")[2]},
        {**pdf_source, "media_type": "text/plain", "data": "eA=="},
        {"type": "text", "media_type": "application/pdf", "data": "x"},
    ):
        block = {"type": "document", "source": source}
        assert validate_anthropic({"messages": [{"role": "user", "content": [block]}]})


def test_an_image_where_a_provider_refuses_it_becomes_a_visible_note() -> None:
    # Stored before the door checked content: never sent where refused, never silently dropped.
    image = {"type": "image_url", "url": PNG_URL}
    messages = [
        Message("system", ({"type": "text", "text": "Be brief."}, image)),
        Message("user", "hi"),
        Message("assistant", ({"type": "text", "text": "look"}, image)),
        Message("system", (image,)),
        Message("user", ()),
    ]
    note = "[image not sent: system messages cannot carry images (only user)]"
    anthropic = to_anthropic(messages, [])
    assert validate_anthropic(anthropic) == []
    assert anthropic["system"] == [{"type": "text", "text": "Be brief." + note}]
    assert anthropic["messages"][1]["content"][1] == {
        "type": "text",
        "text": "[image not sent: assistant messages cannot carry images (only user)]",
    }
    assert anthropic["messages"][2]["content"] == [
        {"type": "text", "text": "System note: " + note},
        {"type": "text", "text": "(empty)"},
    ]
    openai = to_openai(messages, [])
    assert validate_openai(openai) == []
    # System and assistant text goes as one string (what OpenAI-compatible servers accept).
    assert openai["messages"][0]["content"] == "Be brief." + note
    assert openai["messages"][4]["content"] == [{"type": "text", "text": "(empty)"}]


def test_system_text_goes_as_one_string_user_parts_stay_parts() -> None:
    # llama.cpp's server refused a summary's system turn sent as a list of text parts (500).
    summary = Message(
        "system", ({"type": "text", "text": "Summary:\n"}, {"type": "text", "text": "S"})
    )
    pictured = Message(
        "user", ({"type": "text", "text": "see"}, {"type": "image_url", "url": PNG_URL})
    )
    wire = to_openai([summary, pictured], [])
    assert validate_openai(wire) == []
    assert wire["messages"][0]["content"] == "Summary:\nS"
    assert [p["type"] for p in wire["messages"][1]["content"]] == ["text", "image_url"]


def test_validators_refuse_content_the_providers_refuse() -> None:
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    openai_cases = [
        {"role": "system", "content": [image]},
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "user", "content": [{"type": "file", "file": {}}]},
    ]
    for message in openai_cases:
        assert validate_openai({"messages": [message]}), message
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/svg+xml"}}
    assert validate_anthropic({"messages": [{"role": "user", "content": [block]}]})
    png = {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}}
    assert validate_anthropic({"system": [png], "messages": [{"role": "user", "content": "hi"}]})


def test_anthropic_output_is_deterministic_and_does_not_alias_the_input() -> None:
    arguments = {"b": 1, "a": {"y": 2, "x": 3}}
    messages = [
        Message("user", "go"),
        Message("assistant", "", tool_calls=(ToolCall("c", "f", arguments),)),
        Message("tool", "r", tool_call_id="c"),
    ]
    first = to_anthropic(messages, [WEATHER])
    assert json.dumps(first) == json.dumps(to_anthropic(messages, [WEATHER]))
    reordered = [
        messages[0],
        Message("assistant", "", tool_calls=(ToolCall("c", "f", {"a": {"x": 3, "y": 2}, "b": 1}),)),
        messages[2],
    ]
    assert json.dumps(first) == json.dumps(to_anthropic(reordered, [WEATHER]))
    first["messages"][1]["content"][0]["input"]["b"] = 99
    assert arguments["b"] == 1


# --- validators reject broken requests (examples) -----------------------------------------


def call(call_id: str) -> Message:
    return Message("assistant", "", tool_calls=(ToolCall(call_id, "f", {"q": 1}),))


def result(call_id: str) -> Message:
    return Message("tool", "ok", tool_call_id=call_id)


USER = Message("user", "hi")

BROKEN = {
    "result without call": [USER, result("a")],
    "call without result": [USER, call("a"), Message("user", "next")],
    "call without result at the end": [USER, call("a")],
    "result answers another id": [USER, call("a"), result("b")],
    "duplicate ids": [USER, call("a"), result("a"), Message("user", "x"), call("a"), result("a")],
}


def test_openai_validator_rejects_broken_conversations() -> None:
    for name, messages in BROKEN.items():
        assert validate_openai(to_openai(messages, [])), name
    separated = [USER, call("a"), Message("user", "wait"), result("a")]
    assert validate_openai(to_openai(separated, []))
    answered_twice = [USER, call("a"), result("a"), result("a")]
    assert validate_openai(to_openai(answered_twice, []))


def test_anthropic_validator_rejects_broken_conversations() -> None:
    for name, messages in BROKEN.items():
        assert validate_anthropic(to_anthropic(messages, [])), name
    assistant_first = {
        "messages": [
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert validate_anthropic(assistant_first)


def test_a_conversation_of_system_text_only_gets_a_user_turn() -> None:
    request = to_anthropic([Message("system", "S"), Message("system", "Summary: all of it")], [])
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": CONTINUATION_NOTE}]}
    ]
    assert validate_anthropic(request) == []


def test_an_assistant_first_conversation_gets_a_user_turn_before_it() -> None:
    request = to_anthropic([Message("assistant", "hello"), USER], [])
    assert request["messages"][0] == {
        "role": "user",
        "content": [{"type": "text", "text": CONTINUATION_NOTE}],
    }
    assert validate_anthropic(request) == []


def test_anthropic_validator_rejects_a_result_separated_from_its_call() -> None:
    request = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [_use("a")]},
            {"role": "user", "content": "wait"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [_result("a")]},
        ]
    }
    problems = validate_anthropic(request)
    assert any("'a' has no tool_result" in p for p in problems)
    assert any("'a' answers no tool_use" in p for p in problems)


def test_anthropic_validator_rules() -> None:
    cases: dict[str, list[Json]] = {
        "empty": [],
        "system role": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
        "no alternation": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],
        "blank text": [{"role": "user", "content": [{"type": "text", "text": " "}]}],
        "empty blocks": [{"role": "user", "content": []}],
        "empty string": [{"role": "user", "content": ""}],
        "text before result": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [_use("a")]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, _result("a")]},
        ],
        "bad id": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [_use("a.b")]},
            {"role": "user", "content": [_result("a.b")]},
        ],
    }
    for name, messages in cases.items():
        assert validate_anthropic({"messages": messages}), name


def test_openai_validator_rules() -> None:
    good_call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases: dict[str, list[Json]] = {
        "empty": [],
        "unknown role": [{"role": "robot", "content": "x"}],
        "arguments not an object": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [_args(good_call, "[1]")]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
        ],
        "arguments not JSON": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [_args(good_call, "{")]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
        ],
        "duplicate ids in one message": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [good_call, good_call]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
        ],
        "missing content": [{"role": "user"}],
    }
    for name, messages in cases.items():
        assert validate_openai({"messages": messages}), name


def _use(use_id: str) -> Json:
    return {"type": "tool_use", "id": use_id, "name": "f", "input": {}}


def _result(use_id: str) -> Json:
    return {"type": "tool_result", "tool_use_id": use_id, "content": "r"}


def _args(tool_call: Json, arguments: str) -> Json:
    return {**tool_call, "function": {"name": "f", "arguments": arguments}}


# --- generated conversations ----------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
texts = st.text(max_size=20) | st.sampled_from(["", " ", "\n"])
names = st.none() | st.sampled_from(["ann", "bob_2"])
image_urls = st.sampled_from(
    ["https://example.com/a.png", "http://example.com/b.jpg", data_url("image/jpeg", jpeg(9, 7))]
)
text_parts = st.builds(lambda t: {"type": "text", "text": t}, texts)
image_parts = st.builds(
    lambda url, detail: (
        {"type": "image_url", "url": url} | ({} if detail is None else {"detail": detail})
    ),
    image_urls,
    st.sampled_from([None, "low", "high", "auto"]),
)
# Content the door accepts (app.core.content): part lists are never empty, images are user-only.
document_parts = st.sampled_from([PDF_PART, TEXT_PART, {**PDF_PART, "filename": None}])
user_content = texts | st.lists(
    text_parts | image_parts | document_parts, min_size=1, max_size=3
).map(tuple)
assistant_content = texts | st.lists(text_parts, min_size=1, max_size=2).map(tuple)
tool_specs = st.lists(
    st.builds(
        ToolSpec,
        st.sampled_from(["get_weather", "search", "run_code"]),
        texts,
        st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    ),
    max_size=3,
)


@st.composite
def tool_round(draw: st.DrawFn, first_id: int) -> list[Message]:
    """An assistant message with 1-3 calls, then a result for each (in any order)."""
    count = draw(st.integers(1, 3))
    calls = tuple(
        ToolCall(f"toolu_{first_id + n}", draw(st.sampled_from(["f", "g"])), draw(arguments))
        for n in range(count)
    )
    results = [
        Message("tool", draw(texts), tool_call_id=c.id, is_error=draw(st.booleans()))
        for c in draw(st.permutations(calls))
    ]
    return [Message("assistant", draw(assistant_content), tool_calls=calls), *results]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Valid neutral conversations: what a projection may hand to a formatter."""
    messages = [Message("system", draw(texts)) for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()) and messages:
            messages.append(Message("system", draw(texts)))  # a mid-conversation note
        messages.append(Message("user", draw(user_content), name=draw(names)))
        for _ in range(draw(st.integers(0, 2))):
            messages += draw(tool_round(first_id=10 * len(messages)))
        if draw(st.booleans()):
            messages.append(Message("assistant", draw(assistant_content), name=draw(names)))
    return messages


@given(conversations(), tool_specs)
@settings(max_examples=300)
def test_generated_conversations_pass_both_validators(
    messages: list[Message], tools: list[ToolSpec]
) -> None:
    assert validate_openai(to_openai(messages, tools)) == []
    assert validate_anthropic(to_anthropic(messages, tools)) == []


@given(conversations(), tool_specs)
def test_formatting_is_deterministic(messages: list[Message], tools: list[ToolSpec]) -> None:
    for render in (to_neutral, to_openai, to_anthropic):
        assert json.dumps(render(messages, tools)) == json.dumps(render(list(messages), tools))


def _with_calls(messages: list[Message]) -> bool:
    return any(m.tool_calls for m in messages)


def _locate(request: Json, test: Any) -> list[int]:
    return [i for i, m in enumerate(request["messages"]) if test(m)]


@given(conversations().filter(_with_calls), st.data())
def test_openai_validator_rejects_mutated_requests(messages: list[Message], data: Any) -> None:
    request = to_openai(messages, [])
    wire: list[Json] = request["messages"]
    tools_at = _locate(request, lambda m: m["role"] == "tool")
    callers = _locate(request, lambda m: m.get("tool_calls"))
    caller = data.draw(st.sampled_from(callers))
    mutation = data.draw(
        st.sampled_from(["drop result", "drop call", "separate", "duplicate", "bad arguments"])
    )
    broken = copy.deepcopy(wire)
    if mutation == "drop result":
        del broken[data.draw(st.sampled_from(tools_at))]
    elif mutation == "drop call":
        calls = broken[caller]["tool_calls"]
        del calls[data.draw(st.integers(0, len(calls) - 1))]
    elif mutation == "separate":
        broken.insert(caller + 1, {"role": "user", "content": "wait"})
    elif mutation == "duplicate":
        other = data.draw(st.sampled_from(callers))
        broken[other]["tool_calls"].append(copy.deepcopy(broken[caller]["tool_calls"][0]))
    else:
        broken[caller]["tool_calls"][0]["function"]["arguments"] = "[]"
    assert validate_openai({"messages": broken}), mutation


@given(conversations().filter(_with_calls), st.data())
def test_anthropic_validator_rejects_mutated_requests(messages: list[Message], data: Any) -> None:
    request = to_anthropic(messages, [])
    wire: list[Json] = request["messages"]
    callers = _locate(request, lambda m: any(b["type"] == "tool_use" for b in m["content"]))
    caller = data.draw(st.sampled_from(callers))
    mutation = data.draw(
        st.sampled_from(
            ["drop result", "drop use", "separate", "duplicate", "assistant first", "reorder"]
        )
    )
    broken = copy.deepcopy(wire)
    uses = broken[caller]["content"]
    answers = broken[caller + 1]["content"]
    use_at = data.draw(st.sampled_from([i for i, b in enumerate(uses) if b["type"] == "tool_use"]))
    if mutation == "drop result":
        answers[:] = [b for b in answers if b.get("tool_use_id") != uses[use_at]["id"]]
    elif mutation == "drop use":
        del uses[use_at]
    elif mutation == "separate":
        broken[caller + 1 : caller + 1] = [
            {"role": "user", "content": "wait"},
            {"role": "assistant", "content": "ok"},
        ]
    elif mutation == "duplicate":
        other = data.draw(st.sampled_from(callers))
        broken[other]["content"].append(copy.deepcopy(uses[use_at]))
    elif mutation == "assistant first":
        del broken[0]
    else:
        answers.insert(0, _text("x"))
    assert validate_anthropic({"messages": broken}), mutation


def _text(text: str) -> Json:
    return {"type": "text", "text": text}


# --- token counting from the wire -------------------------------------------------------------

tool_calls = st.lists(
    st.builds(ToolCall, st.text(max_size=8), st.text(max_size=8), arguments), max_size=3
).map(tuple)
any_message = st.one_of(
    st.builds(Message, st.just("user"), user_content, name=names),
    st.builds(Message, st.just("system"), assistant_content, name=names),
    st.builds(
        Message,
        st.just("assistant"),
        assistant_content,
        name=names,
        tool_calls=tool_calls,
    ),
    st.builds(
        Message,
        st.just("tool"),
        texts,
        tool_call_id=st.none() | st.text(max_size=8),
        is_error=st.booleans(),
    ),
)


@given(st.lists(any_message, max_size=8), tool_specs)
@settings(max_examples=300)
def test_wire_count_matches_the_neutral_count(
    messages: list[Message], tools: list[ToolSpec]
) -> None:
    counter = HeuristicCounter()
    wire = to_openai(messages, tools)
    assert openai_request_tokens(wire, counter) == request_tokens(messages, tools, counter)


def test_wire_count_by_hand() -> None:
    class Words:
        name = "words"

        def count(self, text: str) -> int:
            return len(text.split())

    messages = [
        Message("user", (IMAGE_PARTS[0], IMAGE_PARTS[1], IMAGE_PARTS[2]), name="ann"),
        Message("assistant", "", tool_calls=(ToolCall("c 1", "f", {}),)),
        Message("tool", "a b c", tool_call_id="c 1"),
    ]
    # priming 3; user 3+1 + 3 words + low 85 + a 1x1 PNG's one tile 85+170 + name 1+1;
    # assistant 3+1 + call 3+2+1+1; tool 3+1 + 3 + id 2
    expected = 3 + (4 + 3 + 85 + 255 + 2) + (4 + 7) + (4 + 3 + 2)
    assert openai_request_tokens(to_openai(messages, []), Words()) == expected


def test_anthropic_cache_breakpoints_mark_the_last_block_sent_of_each_message() -> None:
    messages = [
        Message("system", "S"),
        Message("user", "one"),
        Message("assistant", "  "),  # blank: sends no block, so it takes no mark
        Message("user", "two"),
        Message("assistant", "", tool_calls=(ToolCall("t1", "get_weather", {"city": "Oslo"}),)),
        Message("tool", "cold", tool_call_id="t1"),
        Message("user", "three"),
    ]
    request = to_anthropic(messages, [WEATHER], cache_breakpoints=(0, 2, 4, 5, 6, 99))

    assert validate_anthropic(request) == []
    marks = [
        block.get("id") or block.get("tool_use_id") or block.get("text")
        for block in [*request["system"], *(b for m in request["messages"] for b in m["content"])]
        if block.get("cache_control") == {"type": "ephemeral"}
    ]
    # At most 4, the newest kept: the tool call's block, its result, the last text.
    assert marks == ["t1", "t1", "three"]
    unmarked = to_anthropic(messages, [WEATHER])
    assert "cache_control" not in json.dumps(unmarked)
    chat = [Message("user" if i % 2 else "assistant", f"m{i}") for i in range(14)]
    assert validate_anthropic(to_anthropic(chat, [], range(14))) == []


def test_the_anthropic_validator_allows_four_cache_breakpoints() -> None:
    request = to_anthropic([Message("user", f"u{i}") for i in range(9)], [])
    blocks = request["messages"][0]["content"]
    for block in blocks[:5]:
        block["cache_control"] = {"type": "ephemeral"}
    assert validate_anthropic(request) == ["cache_control: 5 breakpoints, at most 4 are allowed"]


THOUGHT = {"type": "thinking", "thinking": " Let me look. ", "signature": "c2ln/+=="}
REDACTED = {"type": "redacted_thinking", "data": "ZW5j"}


def _thinking_turn() -> list[Message]:
    call = ToolCall("toolu_1", "get_weather", {"city": "Oslo"})
    said = (THOUGHT, REDACTED, {"type": "text", "text": "Looking."})
    return [
        Message("user", "Weather in Oslo?"),
        Message("assistant", said, tool_calls=(call,)),
        Message("tool", "rain", tool_call_id="toolu_1"),
    ]


def test_anthropic_sends_thinking_back_unchanged_first_and_in_order() -> None:
    wire = to_anthropic(_thinking_turn(), (), cache_breakpoints=(1,))

    blocks = wire["messages"][1]["content"]
    assert [b["type"] for b in blocks] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert blocks[0] == THOUGHT and blocks[1] == REDACTED
    assert "cache_control" in blocks[3]  # the mark goes on the last block, never on thinking
    assert validate_anthropic(wire) == []
    thinking_only = [Message("user", "Hi"), Message("assistant", (THOUGHT,))]
    marked = to_anthropic(thinking_only, (), cache_breakpoints=(1,))["messages"][1]["content"]
    assert marked == [THOUGHT]


def test_openai_gets_no_reasoning() -> None:
    wire = to_openai(_thinking_turn(), ())

    assistant = wire["messages"][1]
    assert assistant["content"] == "Looking."
    assert "thinking" not in json.dumps(wire) and "ZW5j" not in json.dumps(wire)
    assert validate_openai(wire) == []
    alone = to_openai([Message("user", "Hi"), Message("assistant", (THOUGHT,))], ())
    assert alone["messages"][1]["content"] == "(empty)"


# --- interleaved thinking: thoughts go back in their place among the turn's tool calls -------


@st.composite
def interleaved_turns(draw: st.DrawFn) -> tuple[list[Any], int]:
    """A model turn as the worker journals it: thoughts (some made after n of the turn's calls,
    n never decreasing, as a stream goes), maybe text, and how many calls it made."""
    calls = draw(st.integers(0, 4))
    thoughts = draw(st.integers(1, 4))
    afters = sorted(draw(st.lists(st.integers(0, calls), min_size=thoughts, max_size=thoughts)))
    parts: list[Any] = []
    for place, after in enumerate(afters):
        part: dict[str, Any] = {"type": "thinking", "thinking": f"t{place}", "signature": "s"}
        if after:
            part["tool_calls_before"] = after
        parts.append(part)
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), {"type": "text", "text": "Let me see."})
    return parts, calls


def _interleaving(blocks: list[dict[str, Any]], call_type: str) -> list[str]:
    """A turn's blocks as their order: t<n> for thoughts, c<id> for calls, x for text."""
    order = []
    for block in blocks:
        if block.get("type") in ("thinking", "reasoning"):
            order.append(block.get("thinking") or block["id"])
        elif block.get("type") == call_type:
            order.append(block.get("id") or block["call_id"])
        else:
            order.append("x")
    return order


def _expected_order(parts: list[Any], calls: int) -> list[str]:
    order, made = [], 0
    for part in parts:
        while made < part.get("tool_calls_before", 0):
            order.append(f"c{made}")
            made += 1
        order.append(part["thinking"] if part["type"] == "thinking" else "x")
    return order + [f"c{n}" for n in range(made, calls)]


@settings(max_examples=150)
@given(interleaved_turns())
def test_thoughts_made_between_tool_calls_go_back_between_them(turn: tuple[list[Any], int]) -> None:
    parts, calls = turn
    made = tuple(ToolCall(f"c{n}", "f", {"n": n}) for n in range(calls))
    messages = [Message("user", "Go."), Message("assistant", tuple(parts), tool_calls=made)]
    messages += [Message("tool", "ok", tool_call_id=f"c{n}") for n in range(calls)]
    (sent,) = [m for m in to_anthropic(messages, [])["messages"] if m["role"] == "assistant"]
    assert _interleaving(sent["content"], "tool_use") == _expected_order(parts, calls)
    # The Responses API: reasoning items among function_call items, the same way.
    items = [
        {**p, "type": "reasoning", "id": p["thinking"], "encrypted_content": "e", "summary": []}
        if p["type"] == "thinking"
        else p
        for p in parts
    ]
    messages[1] = Message("assistant", tuple(items), tool_calls=made)
    body = to_openai_responses(messages, [])
    turn_items = [
        i
        for i in body["input"]
        if i.get("type") in ("reasoning", "function_call") or (i.get("role") == "assistant")
    ]
    expected = [o for o in _expected_order(parts, calls) if o != "x"]
    assert [o for o in _interleaving(turn_items, "function_call") if o != "x"] == expected
