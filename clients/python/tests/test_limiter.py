"""`Limiter` against a real agent and server: every method, the `with`
form, waits that run out, refusals and bad input.

Each test has a tenant of its own. What the bucket holds locally is the
agent's business (a new bucket starts on tollgate-client's initial
allowance, then lives on the server's grants), so the tests read the
effect of a call where it is exact: the server's totals, after the test's
own agent (`own_agent`) has stopped and reported everything; or a drained
bucket, which refills at no more than its rate: `send-invoice`'s half a
token a second where a test needs an acquisition not to be admitted
whatever the machine's speed.
"""

from __future__ import annotations

import math
import time
import uuid

import grpc
import pytest
from conftest import PER_KEY_BUCKET, SHARED_BUCKET, SLOW_BUCKET, Agent, Server, consumed, drain

from tollgate_agent import (
    Acquisition,
    BucketRefused,
    InvalidArgument,
    KeyCheck,
    Limiter,
    NotAdmitted,
    TollgateError,
)


def test_acquire_takes_tokens_and_the_server_counts_them(own_agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        acquisition = limiter.acquire(SHARED_BUCKET, 60, max_wait=20)
        assert isinstance(acquisition, Acquisition)
        assert (acquisition.tenant, acquisition.bucket, acquisition.tokens) == (tenant, SHARED_BUCKET, 60)
        assert 0 <= acquisition.waited < 20
        assert acquisition.fallback is False
        assert uuid.UUID(acquisition.request_id).version == 4
        units = limiter.acquire("", 40, max_wait=20)
        assert (units.bucket, units.tokens) == ("", 40)
    own_agent.stop()
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(60)
    assert consumed(server, tenant, "") == pytest.approx(40)


def test_acquire_raises_not_admitted_after_max_wait_and_takes_nothing(agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter, server, SLOW_BUCKET)
        started = time.monotonic()
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire(SLOW_BUCKET, 60, max_wait=0.5)
        elapsed = time.monotonic() - started
        error = raised.value
        assert (error.tenant, error.bucket, error.tokens) == (tenant, SLOW_BUCKET, 60)
        assert 0.4 <= error.waited <= elapsed + 0.01
        assert elapsed < 5
        for part in (tenant, SLOW_BUCKET, "60"):
            assert part in str(error)
        status = limiter.status(SLOW_BUCKET)
        assert status.waiters == 0 and status.queued_tokens == 0


def test_without_max_wait_an_acquire_waits_at_most_the_timeout(agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket, timeout=1.0) as limiter:
        drain(limiter, server, SLOW_BUCKET)
        started = time.monotonic()
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire(SLOW_BUCKET, 60)
        elapsed = time.monotonic() - started
        assert 0.8 <= elapsed < 3
        assert raised.value.waited <= elapsed + 0.01
        assert limiter.status(SLOW_BUCKET).waiters == 0


def test_not_admitted_names_the_request_unit_bucket(agent: Agent, server: Server) -> None:
    tenant = server.new_tenant(available=100, refill_rate=1, burst_limit=100)
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter, server, "")
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire("", 50, max_wait=0.3)
        assert raised.value.bucket == ""
        assert "request-unit bucket" in str(raised.value)


def test_try_acquire_never_waits_and_says_whether_it_took(agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        assert limiter.try_acquire(SLOW_BUCKET, 1) is True
        drain(limiter, server, SLOW_BUCKET)
        started = time.monotonic()
        assert limiter.try_acquire(SLOW_BUCKET, 50) is False
        assert time.monotonic() - started < 1.0


def test_charge_never_waits_and_is_counted(own_agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        taken = drain(limiter, server, SHARED_BUCKET)
        started = time.monotonic()
        limiter.charge(SHARED_BUCKET, 300)
        assert time.monotonic() - started < 1.0
        # The bucket owes what was charged: nothing is admitted for a while.
        assert limiter.try_acquire(SHARED_BUCKET, 10) is False
    own_agent.stop()
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(taken + 300)


def test_report_prices_the_work_in_request_units(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        assert limiter.report() == 0
        small = limiter.report(write_requests=1, write_bytes=1024)
        large = limiter.report(write_requests=1, write_bytes=1024 * 1024)
        assert 0 < small < large
        assert limiter.report(read_requests=10, read_bytes=4096, cpu_seconds=0.25, egress_bytes=2048) > 0


def test_give_back_returns_tokens_not_yet_reported(own_agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 30, max_wait=20)
        returned = limiter.give_back(SHARED_BUCKET, 30)
        assert 0 <= returned <= 30
    own_agent.stop()
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(30 - returned)


def test_status_describes_the_local_bucket(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 10, max_wait=20)
        status = limiter.status(SHARED_BUCKET)
        assert (status.tenant, status.bucket) == (tenant, SHARED_BUCKET)
        assert math.isfinite(status.tokens)
        assert status.debt >= 0
        assert status.fallback_active is False
        assert status.fallback_rate >= 0
        assert status.waiters == 0 and status.queued_tokens == 0
        assert status.usage_rate >= 0 and status.trickle_rate >= 0
        assert status.instance_id > 0
        assert limiter.status("").instance_id == status.instance_id


def test_with_keeps_the_tokens_of_work_that_succeeds_and_gives_back_those_of_work_that_raises(
    own_agent: Agent, server: Server, tenant: str
) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        with limiter.acquire(SHARED_BUCKET, 60, max_wait=20) as kept:
            assert kept.tokens == 60
        assert kept.returned is None
        with pytest.raises(RuntimeError, match="the work failed"):
            with limiter.acquire(SHARED_BUCKET, 40, max_wait=20) as failed:
                raise RuntimeError("the work failed")
        assert failed.returned is not None
        assert 0 <= failed.returned <= 40
    own_agent.stop()
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(60 + 40 - failed.returned)


def test_a_misspelt_bucket_is_refused_naming_it(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        # Until the server's first answer the agent may admit from the
        # bucket's initial allowance; the refusal follows within seconds.
        deadline = time.monotonic() + 20
        refused = None
        while refused is None and time.monotonic() < deadline:
            try:
                limiter.acquire("schedule-emial", 1, max_wait=1)
            except BucketRefused as error:
                refused = error
        assert refused is not None, "the misspelt bucket was never refused"
        assert refused.code == grpc.StatusCode.NOT_FOUND
        assert (refused.tenant, refused.bucket) == (tenant, "schedule-emial")
        assert "schedule-emial" in str(refused)
        # Every call on the bucket is refused from then on; others still work.
        with pytest.raises(BucketRefused):
            limiter.charge("schedule-emial", 1)
        with pytest.raises(BucketRefused):
            limiter.status("schedule-emial")
        assert limiter.acquire(SHARED_BUCKET, 1, max_wait=20).tokens == 1


def test_invalid_tokens_are_refused_naming_the_field_and_change_nothing(
    own_agent: Agent, server: Server, tenant: str
) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 1, max_wait=20)
        for tokens in (math.nan, math.inf, -1.0, 1e16):
            for call in (limiter.acquire, limiter.try_acquire, limiter.charge, limiter.give_back):
                with pytest.raises(InvalidArgument) as raised:
                    call(SHARED_BUCKET, tokens)
                assert raised.value.field == "tokens", str(raised.value)
                assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert isinstance(raised.value, ValueError)
                assert SHARED_BUCKET in str(raised.value)
    own_agent.stop()
    # Only the one valid acquire was counted.
    assert consumed(server, tenant, SHARED_BUCKET) == pytest.approx(1)


def test_invalid_waits_names_and_reports_are_refused_naming_the_field(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        with pytest.raises(InvalidArgument) as raised:
            limiter.acquire(SHARED_BUCKET, 1, max_wait=-1)
        assert raised.value.field == "max_wait"
        with pytest.raises(InvalidArgument) as raised:
            limiter.acquire(SHARED_BUCKET, 1, max_wait=7200)
        assert raised.value.field == "max_wait"
        with pytest.raises(InvalidArgument) as raised:
            limiter.acquire(SHARED_BUCKET, 1, max_wait=math.inf)
        assert raised.value.field == "max_wait" and raised.value.code is None
        with pytest.raises(InvalidArgument) as raised:
            limiter.acquire("not a bucket!", 1)
        assert raised.value.field == "bucket"
        with pytest.raises(InvalidArgument) as raised:
            limiter.report(cpu_seconds=math.nan)
        assert raised.value.field == "cpu_seconds"
        with pytest.raises(InvalidArgument) as raised:
            limiter.report(read_requests=-1)
        assert raised.value.field == "read_requests"
        with pytest.raises(TypeError, match="tokens"):
            limiter.acquire(SHARED_BUCKET, "50")  # type: ignore[arg-type]
    with Limiter("not a tenant!", socket=agent.socket) as limiter:
        with pytest.raises(InvalidArgument) as raised:
            limiter.status("")
        assert raised.value.field == "tenant"
    with pytest.raises(InvalidArgument) as raised:
        Limiter(tenant, socket=agent.socket, timeout=0)
    assert raised.value.field == "timeout"


def test_check_keys_is_passed_to_the_server(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        first = limiter.check_keys([KeyCheck(PER_KEY_BUCKET, "user-1", 50)])
        assert first.allowed and bool(first)
        (answer,) = first.answers
        assert answer.allowed and not answer.replayed
        assert (answer.refill_rate, answer.burst_limit) == (5, 50)
        assert answer.remaining_tokens < 1
        assert answer.retry_after == 0

        again = limiter.check_keys([(PER_KEY_BUCKET, "user-1", 10)])
        assert not again.allowed and not bool(again)
        assert again.answers[0].retry_after is not None and again.answers[0].retry_after > 0

        # All or nothing: user-2 is not charged when user-1 is refused.
        both = limiter.check_keys([(PER_KEY_BUCKET, "user-2", 50), (PER_KEY_BUCKET, "user-1", 10)])
        assert not both.allowed
        assert limiter.check_keys([(PER_KEY_BUCKET, "user-2", 50)]).allowed


def test_check_keys_refusals_name_the_bucket_or_field(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        with pytest.raises(BucketRefused) as refused:
            limiter.check_keys([("api-calls-per-usr", "user-1")])
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
        assert refused.value.bucket == "api-calls-per-usr"
        assert "api-calls-per-usr" in str(refused.value)
        with pytest.raises(InvalidArgument) as invalid:
            limiter.check_keys([(PER_KEY_BUCKET, "")])
        assert invalid.value.field == "items[0].key"
        with pytest.raises(InvalidArgument) as invalid:
            limiter.check_keys([])
        assert invalid.value.field == "items"


def test_a_closed_limiter_refuses_calls(agent: Agent, tenant: str) -> None:
    limiter = Limiter(tenant, socket=agent.socket)
    limiter.status(SHARED_BUCKET)
    limiter.close()
    with pytest.raises(TollgateError, match="closed"):
        limiter.status(SHARED_BUCKET)


def test_the_server_counts_exactly_what_was_reported(own_agent: Agent, server: Server, tenant: str) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        request_units = limiter.report(read_requests=3, read_bytes=1000, write_requests=2, write_bytes=500)
        request_units += limiter.report(cpu_seconds=0.25, egress_bytes=2000)
    own_agent.stop()
    units = server.bucket(tenant, "")["consumption"]
    assert units["request_units"] == pytest.approx(request_units)
    assert (units["read_requests"], units["read_bytes"]) == (3, 1000)
    assert (units["write_requests"], units["write_bytes"]) == (2, 500)
    assert units["cpu_seconds"] == pytest.approx(0.25)
    assert units["egress_bytes"] == 2000
