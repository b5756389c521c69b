"""The official `openai` SDK as the client of the served API's /openai/v1."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from openai import AsyncOpenAI

from tests.e2e import Service


@pytest.fixture
async def client(api: httpx.AsyncClient, service: Service) -> AsyncIterator[AsyncOpenAI]:
    """An AsyncOpenAI of a fresh tenant (its key is a Threadline key); no retries, so that
    every request the test makes is one request."""
    key = api.headers["Authorization"].removeprefix("Bearer ")
    async with AsyncOpenAI(
        base_url=f"{service.url}/openai/v1", api_key=key, max_retries=0, timeout=120
    ) as openai:
        yield openai
