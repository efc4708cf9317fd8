"""Calls across an agent restart: the agent killed with SIGKILL (no
shutdown, no final report) and started again on the same socket and state
directory. A call made meanwhile retries, with the same request id, until
the agent is back within the call's timeout; and the server's totals, read
after a graceful stop, count every call once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, Dict, Optional

import pytest
from conftest import SHARED_BUCKET, Agent, Server, consumed, drain

from tollgate_agent import Acquisition, AsyncLimiter, Limiter

DOWNTIME = 2.0


class Background:
    """A call on a thread of its own: its result or error, and how long it took."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.result: Dict[str, object] = {}
        self.error: Optional[BaseException] = None
        self.elapsed = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                self.result["value"] = call()
            except BaseException as error:  # reported by the test's assertions
                self.error = error
            self.elapsed = time.monotonic() - started

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> object:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not end"
        if self.error is not None:
            raise self.error
        return self.result["value"]


def test_a_call_made_while_the_agent_is_down_succeeds_once_it_is_back(own_agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket, timeout=30) as limiter:
        limiter.acquire(SHARED_BUCKET, 10, max_wait=20)
        own_agent.kill()
        call = Background(lambda: limiter.charge(SHARED_BUCKET, 5))
        time.sleep(DOWNTIME)
        assert call.thread.is_alive(), "the call ended while the agent was down"
        own_agent.start()
        call.join(30)
        assert call.elapsed >= DOWNTIME
        assert limiter.acquire(SHARED_BUCKET, 1, max_wait=20).tokens == 1


def test_an_acquire_waiting_when_the_agent_is_killed_is_admitted_after_the_restart(
    own_agent: Agent, server: Server, tenant: str
) -> None:
    with Limiter(tenant, socket=own_agent.socket, timeout=30) as limiter:
        drain(limiter, server, SHARED_BUCKET)
        # 30 more tokens take seconds to come: the call is waiting when the
        # agent dies. The restarted agent's new bucket admits it.
        call = Background(lambda: limiter.acquire(SHARED_BUCKET, 30, max_wait=20))
        deadline = time.monotonic() + 10
        while limiter.status(SHARED_BUCKET).waiters == 0:
            assert time.monotonic() < deadline, "the acquire never waited"
            time.sleep(0.05)
        own_agent.kill()
        time.sleep(1.0)
        assert call.thread.is_alive()
        own_agent.start()
        acquisition = call.join(45)
        assert isinstance(acquisition, Acquisition) and acquisition.tokens == 30


def test_an_async_call_made_while_the_agent_is_down_succeeds_once_it_is_back(own_agent: Agent, tenant: str) -> None:
    async def scenario() -> float:
        async with AsyncLimiter(tenant, socket=own_agent.socket, timeout=30) as limiter:
            await limiter.acquire(SHARED_BUCKET, 1, max_wait=20)
            own_agent.kill()
            started = time.monotonic()
            restart = asyncio.get_running_loop().run_in_executor(None, _restart_later, own_agent)
            await limiter.charge(SHARED_BUCKET, 2)
            await restart
            return time.monotonic() - started

    assert asyncio.run(scenario()) >= DOWNTIME


def _restart_later(agent: Agent) -> None:
    time.sleep(DOWNTIME)
    agent.start()


def test_nothing_is_lost_or_counted_twice_across_a_sigkill(own_agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket, timeout=30) as limiter:
        limiter.acquire(SHARED_BUCKET, 20, max_wait=20)
        limiter.charge(SHARED_BUCKET, 5)
        own_agent.kill()
        call = Background(lambda: limiter.charge(SHARED_BUCKET, 7))
        time.sleep(DOWNTIME)
        own_agent.start()
        call.join(30)
        limiter.acquire(SHARED_BUCKET, 3, max_wait=20)
    own_agent.stop()
    counted = consumed(server, tenant, SHARED_BUCKET)
    assert counted == pytest.approx(20 + 5 + 7 + 3), (
        f"the server counted {counted:g} tokens of the 35 the agents answered for: "
        "what the killed agent had admitted or charged but not yet reported must be "
        "reported by its successor from the state directory"
    )
