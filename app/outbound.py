"""Bounded outbound reach: which hosts tool calls (MCP servers, webhook tools) may connect to.

`outbound_allowed` lists host names, `*.domain` patterns, addresses and networks, or `*`.
Link-local and cloud-metadata addresses are refused even under `*`: only an entry naming them
(their host name, or a network containing the address) lets a call reach them. The check is
made on every address the host name resolves to; clients make it again for every request they
send, a redirect's included (the MCP client's request hook, app/tools/mcp.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Where cloud instances answer with their credentials: never reachable by default.
SENSITIVE_NETWORKS: tuple[Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),  # link-local, AWS/GCP/Azure metadata
    ipaddress.ip_network("fe80::/10"),  # IPv6 link-local
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS metadata over IPv6
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud metadata
)
SENSITIVE_NAMES = frozenset({"metadata.google.internal", "metadata", "instance-data"})


class OutboundRefused(Exception):
    """The URL's host is not one tool calls may reach; the message says why."""


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _network(entry: str) -> Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


def _name_listed(host: str, allowed: Sequence[str]) -> bool:
    for entry in allowed:
        entry = entry.lower()
        if entry == host or (entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


def _address_allowed(address: IPAddress, allowed: Sequence[str], name_listed: bool) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    networks = [n for n in (_network(e) for e in allowed) if n is not None]
    if name_listed or any(address in n for n in networks):
        return True
    if any(address in n for n in SENSITIVE_NETWORKS):
        return False
    return "*" in allowed


async def check_url(url: str, allowed: Sequence[str]) -> None:
    """Raise OutboundRefused unless every address `url`'s host resolves to may be reached."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise OutboundRefused(f"{url!r} is not a URL") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise OutboundRefused(f"{url!r} is not an absolute http(s) URL")
    name_listed = _name_listed(host, allowed)
    literal = _address(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        if host in SENSITIVE_NAMES and not name_listed:
            raise OutboundRefused(f"{host} is a cloud metadata address, not in outbound_allowed")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise OutboundRefused(f"{host} does not resolve: {exc}") from exc
        addresses = [a for a in (_address(str(info[4][0])) for info in infos) if a is not None]
    for address in addresses:
        if not _address_allowed(address, allowed, name_listed):
            raise OutboundRefused(
                f"{host} ({address}) is not an address tool calls may reach (outbound_allowed)"
            )
