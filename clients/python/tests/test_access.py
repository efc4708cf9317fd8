"""The agent's access rules as a limiter meets them: an agent listening on
loopback TCP besides its socket, with an access file that lists one tenant
and its token. TCP callers need the tenant's token; socket callers are
trusted by the socket's file mode; an unlisted tenant is served to nobody."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from conftest import SHARED_BUCKET, Agent, Server, free_port

from tollgate_agent import Limiter, PermissionDenied, Unauthenticated


@dataclass
class Guarded:
    agent: Agent
    address: str
    listed: str
    token: str
    unlisted: str


@pytest.fixture(scope="module")
def guarded(tollgate_bin: str, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    directory: Path = tmp_path_factory.mktemp("guarded")
    listed = server.new_tenant()
    unlisted = server.new_tenant()
    token = secrets.token_hex(16)
    access = directory / "access.toml"
    access.write_text(f'[tenants."{listed}"]\ntoken = "{token}"\n')
    address = f"127.0.0.1:{free_port()}"
    agent = Agent(tollgate_bin, server, directory / "agent", listen=address, access=access)
    try:
        yield Guarded(agent, address, listed, token, unlisted)
    finally:
        agent.close()


def test_a_tcp_caller_with_the_tenant_token_is_served(guarded: Guarded) -> None:
    with Limiter(guarded.listed, address=guarded.address, token=guarded.token) as limiter:
        assert limiter.acquire(SHARED_BUCKET, 5, max_wait=20).tokens == 5
        assert limiter.status(SHARED_BUCKET).tenant == guarded.listed


def test_a_tcp_caller_without_a_token_is_unauthenticated(guarded: Guarded) -> None:
    with Limiter(guarded.listed, address=guarded.address) as limiter:
        with pytest.raises(Unauthenticated) as raised:
            limiter.acquire(SHARED_BUCKET, 5)
    assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert raised.value.tenant == guarded.listed


def test_a_tcp_caller_with_a_wrong_token_is_unauthenticated(guarded: Guarded) -> None:
    with Limiter(guarded.listed, address=guarded.address, token=guarded.token + "x") as limiter:
        with pytest.raises(Unauthenticated):
            limiter.charge(SHARED_BUCKET, 5)


def test_a_tenant_the_access_file_does_not_list_is_denied(guarded: Guarded) -> None:
    with Limiter(guarded.unlisted, address=guarded.address, token=guarded.token) as limiter:
        with pytest.raises(PermissionDenied) as raised:
            limiter.try_acquire(SHARED_BUCKET, 5)
        assert guarded.unlisted in str(raised.value)
    with Limiter(guarded.unlisted, socket=guarded.agent.socket) as limiter:
        with pytest.raises(PermissionDenied) as raised:
            limiter.try_acquire(SHARED_BUCKET, 5)
    assert raised.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert raised.value.tenant == guarded.unlisted


def test_a_socket_caller_needs_no_token(guarded: Guarded) -> None:
    with Limiter(guarded.listed, socket=guarded.agent.socket) as limiter:
        assert limiter.acquire(SHARED_BUCKET, 5, max_wait=20).tokens == 5
