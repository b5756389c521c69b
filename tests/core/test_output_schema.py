"""Structured output's schema rules (OpenAI's strict mode), the answer check and the
fingerprint: strict schemas of any shape pass, every broken rule is named by a JSON pointer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.output_schema import (
    MAX_DEPTH,
    MAX_ENUM_VALUES,
    MAX_NESTING,
    MAX_PROPERTIES,
    ResponseFormat,
    answer_problem,
    fingerprint,
    schema_problem,
)


def obj(**properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


PERSON = obj(
    name={"type": "string", "description": "Their name"},
    age={"type": ["integer", "null"], "minimum": 0},
    email={"type": "string", "format": "email"},
    tags={"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 3},
    role={"enum": ["admin", "user"]},
    manager={"anyOf": [{"$ref": "#/$defs/person"}, {"type": "null"}]},
)
PERSON["$defs"] = {"person": obj(name={"type": "string"}, reports={"$ref": "#"})}

names = st.text(st.characters(codec="utf-8", exclude_characters="/~"), min_size=1, max_size=8)
leaves = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer", "minimum": 0},
        {"type": "number"},
        {"type": "boolean"},
        {"type": ["string", "null"]},
        {"enum": ["a", "b", 1, None]},
        {"const": "fixed"},
        {"type": "string", "format": "date"},
    ]
)


def objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(names, children, max_size=4).map(lambda p: obj(**p))


nodes = st.recursive(
    leaves,
    lambda children: st.one_of(
        objects(children),
        children.map(lambda items: {"type": "array", "items": items}),
        st.lists(children, min_size=1, max_size=3).map(lambda options: {"anyOf": options}),
    ),
    max_leaves=8,
)
strict_schemas = objects(nodes)


def objects_in(schema: Any, pointer: str = "") -> list[str]:
    """The JSON pointers of every object schema in `schema`."""
    found = []
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            found.append(pointer)
        for key, value in schema.items():
            if key == "properties":
                for name, sub in value.items():
                    escaped = name.replace("~", "~0").replace("/", "~1")
                    found += objects_in(sub, f"{pointer}/properties/{escaped}")
            elif key == "items":
                found += objects_in(value, f"{pointer}/items")
            elif key == "anyOf":
                for i, sub in enumerate(value):
                    found += objects_in(sub, f"{pointer}/anyOf/{i}")
    return found


def at(schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    node: Any = schema
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    assert isinstance(node, dict)
    return node


def test_a_strict_schema_with_definitions_and_recursion_passes() -> None:
    assert schema_problem(PERSON) is None


@given(strict_schemas)
def test_every_strict_schema_passes(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None


@given(strict_schemas, st.data())
def test_an_object_without_additional_properties_false_is_named(
    schema: dict[str, Any], data: st.DataObject
) -> None:
    pointer = data.draw(st.sampled_from(objects_in(schema)))
    broken = json.loads(json.dumps(schema))
    loosened = data.draw(st.sampled_from([None, True, {"type": "string"}]))
    if loosened is None:
        del at(broken, pointer)["additionalProperties"]
    else:
        at(broken, pointer)["additionalProperties"] = loosened

    problem = schema_problem(broken)

    assert problem is not None
    assert problem.pointer == f"{pointer}/additionalProperties", problem


@given(strict_schemas, st.data())
def test_an_optional_property_is_named(schema: dict[str, Any], data: st.DataObject) -> None:
    pointer = data.draw(
        st.sampled_from([p for p in objects_in(schema) if at(schema, p)["properties"]] or [""])
    )
    broken = json.loads(json.dumps(schema))
    node = at(broken, pointer)
    node["properties"] = node["properties"] or {"x": {"type": "string"}}
    node["required"] = node["required"][1:]

    problem = schema_problem(broken)

    assert problem is not None and problem.pointer == f"{pointer}/required", problem


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = obj(inner=schema)
    return schema


@pytest.mark.parametrize(
    ("schema", "pointer", "words"),
    [
        ([], "", "JSON object"),
        ({"type": "array", "items": {"type": "string"}}, "", "root"),
        ({"anyOf": [obj()]}, "", "root"),
        ({**obj(), "additionalProperties": True}, "/additionalProperties", "false"),
        (obj(a={"type": "string", "minLength": 1}), "/properties/a/minLength", "not supported"),
        (obj(a={"allOf": [{"type": "string"}]}), "/properties/a/allOf", "not supported"),
        (obj(a={"oneOf": [{"type": "string"}]}), "/properties/a/oneOf", "not supported"),
        ({**obj(), "patternProperties": {}}, "/patternProperties", "not supported"),
        ({**obj(), "$id": "https://example.com/s"}, "/$id", "not supported"),
        (obj(a={"type": "date"}), "/properties/a/type", "type must be"),
        (obj(a={}), "/properties/a", "needs a type"),
        (obj(a={"type": "array"}), "/properties/a", "items"),
        (obj(a={"type": "string", "format": "phone"}), "/properties/a/format", "format"),
        (obj(a={"type": "string", "minimum": 1}), "/properties/a", "numbers only"),
        (obj(a={"type": "string", "pattern": "(?<=a"}), "/properties/a/pattern", "regex"),
        (obj(a={"enum": []}), "/properties/a/enum", "non-empty"),
        (obj(a={"enum": [{"x": 1}]}), "/properties/a/enum", "strings, numbers"),
        (obj(a={**obj(), "$defs": {}}), "/properties/a/$defs", "root only"),
        (obj(a={"$ref": "https://example.com/s.json"}), "/properties/a/$ref", "no other"),
        (obj(a={"$ref": "#/$defs/missing"}), "/properties/a/$ref", "no such definition"),
        (obj(a={"$ref": "#", "type": "object"}), "/properties/a/type", "$ref takes only"),
        (nested(MAX_NESTING + 1), "/properties/inner" * MAX_NESTING, "nested"),
    ],
)
def test_a_schema_strict_mode_refuses_is_named(schema: Any, pointer: str, words: str) -> None:
    problem = schema_problem(schema)

    assert problem is not None
    assert problem.pointer == pointer and words in problem.message, problem


def test_reference_loops_that_describe_no_value_are_refused() -> None:
    itself = {**obj(a={"$ref": "#/$defs/a"}), "$defs": {"a": {"$ref": "#/$defs/a"}}}
    mutual = {
        **obj(a={"$ref": "#/$defs/a"}),
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
    }
    # Recursion through an object is a tree of values (a linked list): allowed.
    through_object = {
        **obj(head={"$ref": "#/$defs/node"}),
        "$defs": {"node": obj(next={"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]})},
    }

    for looped in (itself, mutual):
        problem = schema_problem(looped)
        assert problem is not None and problem.pointer == "/$defs/a", problem
        assert "refers to itself" in problem.message
    assert schema_problem(through_object) is None


def test_sizes_and_depths_beyond_the_limits_are_refused() -> None:
    many = obj(**{f"p{i}": {"type": "string"} for i in range(MAX_PROPERTIES + 1)})
    enums = obj(**{f"e{i}": {"enum": list(range(100))} for i in range(MAX_ENUM_VALUES // 100 + 1)})
    long_names = obj(**{"n" * 60_000 + str(i): {"type": "string"} for i in range(3)})
    big_enum = obj(e={"enum": [f"{i:03d}" + "x" * 60 for i in range(260)]})
    deep_any_of: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_DEPTH + 5):
        deep_any_of = {"anyOf": [deep_any_of]}

    assert (p := schema_problem(many)) and p.pointer == "/properties", p
    assert (p := schema_problem(enums)) and p.pointer.endswith("/enum"), p
    assert (p := schema_problem(long_names)) and "characters" in p.message, p
    assert (p := schema_problem(big_enum)) and p.pointer == "/properties/e/enum", p
    assert (p := schema_problem(obj(a=deep_any_of))) and "deep" in p.message, p


def test_an_answer_is_checked_against_its_schema() -> None:
    answer: dict[str, Any] = {
        "name": "Ada",
        "age": None,
        "email": "ada@example.com",
        "tags": ["math"],
        "role": "admin",
        "manager": {"name": "Charles", "reports": {**dict.fromkeys(PERSON["required"])}},
    }
    answer["manager"]["reports"] |= {
        "name": "B",
        "email": "b@example.com",
        "tags": [],
        "role": "user",
    }

    assert answer_problem(PERSON, json.dumps(answer)) is None
    wrong_age = answer_problem(PERSON, json.dumps({**answer, "age": -1}))
    assert wrong_age is not None and wrong_age.startswith("at /age:")
    extra = answer_problem(PERSON, json.dumps({**answer, "extra": 1}))
    assert extra is not None and "extra" in extra
    missing = {k: v for k, v in answer.items() if k != "role"}
    assert "role" in (answer_problem(PERSON, json.dumps(missing)) or "")
    assert "not JSON" in (answer_problem(PERSON, '{"name": "Ada", "age') or "")


def test_the_format_round_trips_and_its_fingerprint_ignores_key_order() -> None:
    given_format = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    parsed = ResponseFormat.model_validate(given_format)
    reordered = dict(reversed(list(PERSON.items())))

    assert parsed.as_json() == given_format
    assert ResponseFormat.model_validate(parsed.as_json()) == parsed
    assert parsed.mark() == {"name": "person", "schema_sha256": fingerprint(reordered)}
    assert fingerprint(PERSON) != fingerprint(obj(name={"type": "string"}))
