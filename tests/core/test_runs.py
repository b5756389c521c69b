"""RunParams as stored with a run: what an ask asked for reads back the same."""

from __future__ import annotations

import json

import pytest

from app.core.runs import RunParams
from app.core.tool_choice import NamedTool, ToolChoice


@pytest.mark.parametrize("choice", ["auto", "none", "required", NamedTool("get_weather")])
@pytest.mark.parametrize("parallel", [True, False])
def test_tool_choice_and_parallel_calls_survive_the_params_column(
    choice: ToolChoice, parallel: bool
) -> None:
    params = RunParams(tool_choice=choice, parallel_tool_calls=parallel)

    stored = json.loads(json.dumps(params.ask_json()))  # the jsonb column's round trip

    assert RunParams.from_json(stored) == params


def test_runs_stored_before_tool_choice_existed_read_as_auto_and_parallel() -> None:
    params = RunParams.from_json({"max_output_tokens": 5, "tools": []})

    assert params.tool_choice == "auto" and params.parallel_tool_calls is True
