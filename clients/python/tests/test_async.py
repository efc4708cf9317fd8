"""`AsyncLimiter` against a real agent and server: the same calls as the
sync limiter, `async with`, waits that run out, cancellation, refusals."""

from __future__ import annotations

import asyncio
import math
import time

import grpc
import pytest
from conftest import PER_KEY_BUCKET, SHARED_BUCKET, SLOW_BUCKET, Agent, Server, consumed, drain

from tollgate_agent import (
    AsyncAcquisition,
    AsyncLimiter,
    BucketRefused,
    InvalidArgument,
    Limiter,
    NotAdmitted,
    Status,
)


def test_every_call_of_the_async_limiter_reaches_the_agent(agent: Agent, tenant: str) -> None:
    async def scenario() -> None:
        async with AsyncLimiter(tenant, socket=agent.socket) as limiter:
            acquisition = await limiter.acquire(SHARED_BUCKET, 60, max_wait=20)
            assert isinstance(acquisition, AsyncAcquisition)
            assert (acquisition.tenant, acquisition.bucket, acquisition.tokens) == (tenant, SHARED_BUCKET, 60)
            assert acquisition.fallback is False
            # The first grant trickles in (a new pod's is short): a token
            # is there within a second or two.
            deadline = time.monotonic() + 10
            while not await limiter.try_acquire(SHARED_BUCKET, 1):
                assert time.monotonic() < deadline, "try_acquire never admitted"
                await asyncio.sleep(0.05)
            await limiter.charge(SHARED_BUCKET, 5)
            assert await limiter.report(write_requests=1, write_bytes=100) > 0
            returned = await limiter.give_back(SHARED_BUCKET, 1)
            assert 0 <= returned <= 1
            status = await limiter.status(SHARED_BUCKET)
            assert (status.tenant, status.bucket) == (tenant, SHARED_BUCKET)
            assert status.waiters == 0
            checked = await limiter.check_keys([(PER_KEY_BUCKET, "user-1", 50)])
            assert checked.allowed
            assert not (await limiter.check_keys([(PER_KEY_BUCKET, "user-1", 50)])).allowed

    asyncio.run(scenario())


def test_async_with_gives_the_tokens_back_when_the_work_raises(own_agent: Agent, server: Server, tenant: str) -> None:
    async def scenario() -> float:
        async with AsyncLimiter(tenant, socket=own_agent.socket) as limiter:
            async with limiter.acquire(SHARED_BUCKET, 30, max_wait=20) as kept:
                pass
            assert kept.returned is None
            with pytest.raises(ValueError, match="the work failed"):
                async with limiter.acquire(SHARED_BUCKET, 60, max_wait=20) as failed:
                    raise ValueError("the work failed")
            assert failed.returned is not None and 0 <= failed.returned <= 60
            return failed.returned

    returned = asyncio.run(scenario())
    own_agent.stop()
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(30 + 60 - returned)


def test_async_max_wait_raises_not_admitted(agent: Agent, server: Server, tenant: str) -> None:
    async def scenario() -> None:
        async with AsyncLimiter(tenant, socket=agent.socket) as limiter:
            started = time.monotonic()
            with pytest.raises(NotAdmitted) as raised:
                await limiter.acquire(SLOW_BUCKET, 60, max_wait=0.5)
            assert time.monotonic() - started < 5
            assert (raised.value.tenant, raised.value.bucket, raised.value.tokens) == (tenant, SLOW_BUCKET, 60)
            assert raised.value.waited >= 0.4

    # The agent's bucket is the tenant's, whichever limiter drains it.
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter, server, SLOW_BUCKET)
    asyncio.run(scenario())


def test_a_cancelled_async_acquire_leaves_the_queue(agent: Agent, server: Server, tenant: str) -> None:
    async def waiters(limiter: AsyncLimiter, expected: int) -> Status:
        deadline = time.monotonic() + 10
        while True:
            status = await limiter.status(SLOW_BUCKET)
            if status.waiters == expected or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        async with AsyncLimiter(tenant, socket=agent.socket) as limiter:

            async def wait_for_tokens() -> AsyncAcquisition:
                return await limiter.acquire(SLOW_BUCKET, 90, max_wait=60)

            task = asyncio.ensure_future(wait_for_tokens())
            assert (await waiters(limiter, 1)).waiters == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            status = await waiters(limiter, 0)
            assert status.waiters == 0 and status.queued_tokens == 0

    # The agent's bucket is the tenant's, whichever limiter drains it.
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter, server, SLOW_BUCKET)
    asyncio.run(scenario())


def test_async_refusals_name_the_bucket_and_the_field(agent: Agent, tenant: str) -> None:
    async def scenario() -> None:
        async with AsyncLimiter(tenant, socket=agent.socket) as limiter:
            with pytest.raises(InvalidArgument) as invalid:
                await limiter.acquire(SHARED_BUCKET, math.nan)
            assert invalid.value.field == "tokens"
            deadline = time.monotonic() + 20
            refused = None
            while refused is None and time.monotonic() < deadline:
                try:
                    await limiter.charge("schedule-emial", 1)
                    await asyncio.sleep(0.1)
                except BucketRefused as error:
                    refused = error
            assert refused is not None, "the misspelt bucket was never refused"
            assert refused.code == grpc.StatusCode.NOT_FOUND
            assert refused.bucket == "schedule-emial" and "schedule-emial" in str(refused)

    asyncio.run(scenario())
