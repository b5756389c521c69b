"""The facade's service: a response just asked is what loading it reads."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.core.runs import RunStatus
from app.openai_api import service
from app.openai_api.items import conversation_id
from app.openai_api.schemas import ResponseCreate
from app.services.quotas import Limits
from tests.db.test_runs import new_session


async def test_a_response_just_asked_is_what_loading_it_reads(
    engine: AsyncEngine, settings: Settings
) -> None:
    """The ask's response is built from what the ask committed (no statement reads it back):
    it is what a load of the response reads, tools, instructions and all."""
    tenant, session_id = await new_session(engine)
    tool = {"type": "function", "name": "pick", "parameters": {"type": "object"}}
    body = ResponseCreate.model_validate(
        {
            "model": "gpt-4o-mini",
            "input": "Hi",
            "conversation": conversation_id(session_id),
            "tools": [tool],
            "background": True,
        }
    )
    created = await service.create_response(engine, settings, tenant, body, None, Limits())
    made = created.loaded
    read = await service.load(engine, tenant, made.id)
    assert made.run.status is RunStatus.QUEUED  # no worker was offered it
    assert made == read
    assert [t["name"] for t in made.tools] == ["pick"]
    assert made.parts and made.latest
