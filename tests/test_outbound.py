"""Outbound reach: metadata and link-local addresses refused unless listed, also behind a name;
a restricted list refuses what it does not name."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from app.outbound import OutboundRefused, check_url


def resolving_to(address: str) -> Any:
    """A resolver answering every name with `address` (as a rebinding DNS name would)."""

    async def resolve(host: str, port: int, **kwargs: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    return resolve


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://169.254.10.1:8080/",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://100.100.100.200/",
    ],
)
async def test_metadata_and_link_local_are_refused_under_the_default(url: str) -> None:
    with pytest.raises(OutboundRefused):
        await check_url(url, ["*"])


async def test_loopback_and_private_addresses_pass_the_default() -> None:
    await check_url("http://127.0.0.1:8000/mcp", ["*"])
    await check_url("http://10.1.2.3/mcp", ["*"])
    await check_url("http://localhost:9/mcp", ["*"])


async def test_a_listed_metadata_network_or_name_is_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await check_url("http://169.254.169.254/", ["169.254.169.254/32"])
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolving_to("169.254.169.254"))
    await check_url("http://metadata.google.internal/", ["metadata.google.internal"])
    with pytest.raises(OutboundRefused):
        await check_url("http://metadata.google.internal/", ["*"])


async def test_a_restricted_list_refuses_what_it_does_not_name() -> None:
    allowed = ["127.0.0.0/8", "*.example.com"]
    await check_url("http://127.0.0.1:1/", allowed)
    with pytest.raises(OutboundRefused, match=r"10\.0\.0\.1"):
        await check_url("http://10.0.0.1/", allowed)


async def test_a_name_resolving_to_a_metadata_address_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check is made on what the name resolves to, not on the name."""
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolving_to("169.254.169.254"))
    with pytest.raises(OutboundRefused, match=r"innocent.example.com \(169.254.169.254\)"):
        await check_url("https://innocent.example.com/mcp", ["*"])


@pytest.mark.parametrize("url", ["ftp://example.com/", "not a url", "http:///nohost"])
async def test_what_is_no_http_url_is_refused(url: str) -> None:
    with pytest.raises(OutboundRefused):
        await check_url(url, ["*"])
