"""`Limiter` against a real agent and server: every method, the `with`
form, waits that run out, refusals and bad input.

Each test has a tenant of its own on the shared agent (`agent`), except
those that stop their agent to read the server's exact totals
(`own_agent`). `schedule-email` refills 10 tokens a second up to 100, so
after taking 100 a test knows the bucket is nearly empty.
"""

from __future__ import annotations

import math
import time
import uuid

import grpc
import pytest
from conftest import PER_KEY_BUCKET, SHARED_BUCKET, Agent, Server

from tollgate_agent import (
    Acquisition,
    BucketRefused,
    InvalidArgument,
    KeyCheck,
    Limiter,
    NotAdmitted,
    TollgateError,
)

# schedule-email's refill rate, tokens per second.
REFILL = 10.0


def drain(limiter: Limiter) -> None:
    """Takes the whole burst of schedule-email."""
    limiter.acquire(SHARED_BUCKET, 100, max_wait=20)


def test_acquire_takes_tokens_from_a_named_bucket(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        started = time.monotonic()
        acquisition = limiter.acquire(SHARED_BUCKET, 60, max_wait=20)
        assert isinstance(acquisition, Acquisition)
        assert (acquisition.tenant, acquisition.bucket, acquisition.tokens) == (tenant, SHARED_BUCKET, 60)
        assert 0 <= acquisition.waited < 20
        assert acquisition.fallback is False
        assert uuid.UUID(acquisition.request_id).version == 4
        # 60 of the burst of 100 are gone: 60 more are not there within a second.
        with pytest.raises(NotAdmitted):
            limiter.acquire(SHARED_BUCKET, 60, max_wait=1)
        status = limiter.status(SHARED_BUCKET)
        assert status.tokens <= 40 + REFILL * (time.monotonic() - started) + 1e-6


def test_acquire_from_the_request_unit_bucket(agent: Agent, server: Server) -> None:
    tenant = server.new_tenant(available=500, refill_rate=1, burst_limit=500)
    with Limiter(tenant, socket=agent.socket) as limiter:
        acquisition = limiter.acquire("", 400, max_wait=20)
        assert (acquisition.bucket, acquisition.tokens) == ("", 400)
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire("", 400, max_wait=0.5)
        assert "request-unit bucket" in str(raised.value)


def test_try_acquire_never_waits_and_says_whether_it_took(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter)
        started = time.monotonic()
        assert limiter.try_acquire(SHARED_BUCKET, 50) is False
        assert time.monotonic() - started < 1.0
        # The bucket refills at 10 tokens a second: 5 are there within seconds.
        deadline = time.monotonic() + 10
        while not limiter.try_acquire(SHARED_BUCKET, 5):
            assert time.monotonic() < deadline, "5 tokens never came back"
            time.sleep(0.1)


def test_charge_after_the_fact_puts_the_bucket_in_debt(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter)
        started = time.monotonic()
        limiter.charge(SHARED_BUCKET, 300)
        assert time.monotonic() - started < 1.0
        status = limiter.status(SHARED_BUCKET)
        assert status.tokens - status.debt < 0
        # What is owed is paid first: nothing is admitted for a while.
        assert limiter.try_acquire(SHARED_BUCKET, 10) is False


def test_report_prices_the_work_in_request_units(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        assert limiter.report() == 0
        small = limiter.report(write_requests=1, write_bytes=1024)
        large = limiter.report(write_requests=1, write_bytes=1024 * 1024)
        mixed = limiter.report(
            read_requests=10,
            read_bytes=4096,
            write_requests=2,
            write_bytes=100,
            cpu_seconds=0.25,
            egress_bytes=2048,
        )
        assert 0 < small < large
        assert mixed > 0
        assert limiter.status("").usage_rate >= 0


def test_give_back_returns_tokens_not_yet_reported(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter)
        before = limiter.status(SHARED_BUCKET).tokens
        returned = limiter.give_back(SHARED_BUCKET, 30)
        after = limiter.status(SHARED_BUCKET).tokens
        assert 0 <= returned <= 30
        assert after >= before + returned - 1e-6
        if returned == 30:
            assert limiter.try_acquire(SHARED_BUCKET, 30) is True


def test_status_describes_the_local_bucket(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 10, max_wait=20)
        status = limiter.status(SHARED_BUCKET)
        assert (status.tenant, status.bucket) == (tenant, SHARED_BUCKET)
        assert 0 <= status.tokens <= 100
        assert status.debt >= 0
        assert status.fallback_active is False
        assert status.fallback_rate >= 0
        assert status.waiters == 0 and status.queued_tokens == 0
        assert math.isfinite(status.usage_rate) and math.isfinite(status.trickle_rate)


def test_with_keeps_the_tokens_when_the_work_succeeds(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        with limiter.acquire(SHARED_BUCKET, 60, max_wait=20) as acquisition:
            assert acquisition.tokens == 60
        assert acquisition.returned is None
        assert limiter.try_acquire(SHARED_BUCKET, 60) is False


def test_with_gives_the_tokens_back_when_the_work_raises(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        with pytest.raises(RuntimeError, match="the work failed"):
            with limiter.acquire(SHARED_BUCKET, 60, max_wait=20) as acquisition:
                raise RuntimeError("the work failed")
        assert acquisition.returned is not None
        assert 0 <= acquisition.returned <= 60
        if acquisition.returned == 60:
            # All 60 came back: they can be taken again at once.
            assert limiter.try_acquire(SHARED_BUCKET, 60) is True


def test_max_wait_raises_not_admitted_naming_the_call(agent: Agent, tenant: str) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        drain(limiter)
        started = time.monotonic()
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire(SHARED_BUCKET, 60, max_wait=0.5)
        elapsed = time.monotonic() - started
        error = raised.value
        assert (error.tenant, error.bucket, error.tokens) == (tenant, SHARED_BUCKET, 60)
        assert 0.4 <= error.waited <= elapsed + 0.01
        assert elapsed < 5
        for part in (tenant, SHARED_BUCKET, "60"):
            assert part in str(error)
        # Nothing was taken, and nobody is left waiting.
        status = limiter.status(SHARED_BUCKET)
        assert status.waiters == 0 and status.queued_tokens == 0


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


@pytest.mark.parametrize("tokens", [math.nan, math.inf, -1.0, 1e16])
def test_invalid_tokens_are_refused_naming_the_field(agent: Agent, tenant: str, tokens: float) -> None:
    with Limiter(tenant, socket=agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 1, max_wait=20)
        before = limiter.status(SHARED_BUCKET).tokens
        for call in (
            lambda: limiter.acquire(SHARED_BUCKET, tokens),
            lambda: limiter.try_acquire(SHARED_BUCKET, tokens),
            lambda: limiter.charge(SHARED_BUCKET, tokens),
            lambda: limiter.give_back(SHARED_BUCKET, tokens),
        ):
            with pytest.raises(InvalidArgument) as raised:
                call()
            assert raised.value.field == "tokens", str(raised.value)
            assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert isinstance(raised.value, ValueError)
        # Nothing was taken, charged or given back.
        after = limiter.status(SHARED_BUCKET)
        assert before - 1e-6 <= after.tokens <= before + REFILL * 5
        assert after.debt == 0


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


def test_the_server_counts_exactly_what_was_taken_charged_given_back_and_reported(
    own_agent: Agent, server: Server, tenant: str
) -> None:
    with Limiter(tenant, socket=own_agent.socket) as limiter:
        limiter.acquire(SHARED_BUCKET, 30, max_wait=20)
        limiter.charge(SHARED_BUCKET, 7)
        with pytest.raises(KeyError):
            with limiter.acquire(SHARED_BUCKET, 10, max_wait=20) as failed:
                raise KeyError("work failed")
        assert failed.returned is not None
        request_units = limiter.report(read_requests=3, read_bytes=1000, write_requests=2, write_bytes=500)
        request_units += limiter.report(cpu_seconds=0.25, egress_bytes=2000)
    own_agent.stop()

    shared = server.bucket(tenant, SHARED_BUCKET)
    assert shared["consumption"]["request_units"] == pytest.approx(30 + 7 + 10 - failed.returned)
    units = server.bucket(tenant, "")["consumption"]
    assert units["request_units"] == pytest.approx(request_units)
    assert (units["read_requests"], units["read_bytes"]) == (3, 1000)
    assert (units["write_requests"], units["write_bytes"]) == (2, 500)
    assert units["cpu_seconds"] == pytest.approx(0.25)
    assert units["egress_bytes"] == 2000
