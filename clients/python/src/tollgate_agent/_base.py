"""What the sync and the asyncio limiters share: their settings, the request
each method sends and how each answer reads.

The two limiters differ only in how they wait (a blocking call and
`time.sleep`, or a coroutine and `asyncio.sleep`); every request is built
and every answer read here, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

import grpc

from tollgate_agent import _messages as m
from tollgate_agent._errors import (
    AgentUnavailable,
    NotAdmitted,
    TollgateError,
    bucket_display,
    error_from_status,
)
from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2
from tollgate_agent._proto.tollgate.v1 import key_limits_pb2


# The least time an attempt is given. With less left, a retried call
# gives up with the last answer it had: an attempt cut off by the call's
# deadline would end as DEADLINE_EXCEEDED (for an acquisition, "not
# admitted") although the agent had answered UNAVAILABLE.
_LAST_ATTEMPT = 0.1


@dataclass(frozen=True)
class Admission:
    """What an admitted `acquire` got."""

    tenant: str
    bucket: str
    tokens: float
    #: Seconds the call waited in the bucket's queue.
    waited: float
    #: True if the tokens came from the fallback rate (the server was not
    #: reachable); they are charged to the tenant when it is back.
    fallback: bool
    #: The request id the acquisition was made with.
    request_id: str


@dataclass(frozen=True)
class Attempt:
    """One call's plan: what to send, what it names, until when to retry."""

    rpc: str
    request: object
    bucket: Optional[str]
    deadline: float


class Retrying:
    """The retry loop's state for one call: the last retried answer, so that
    a call that runs out of time says what it kept getting."""

    def __init__(self, limiter: LimiterSettings, attempt: Attempt) -> None:
        self.limiter = limiter
        self.attempt = attempt
        self.retries = 0
        self.last: Optional[Tuple[grpc.StatusCode, str]] = None

    def remaining(self) -> float:
        return self.attempt.deadline - time.monotonic()

    def out_of_time(self) -> AgentUnavailable:
        settings = self.limiter
        what = bucket_display(self.attempt.bucket)
        if self.last is None:
            reason = "no attempt was made"
        else:
            reason = f"last answer {self.last[0].name}: {self.last[1]}"
        return AgentUnavailable(
            f"{self.attempt.rpc} on {what} of tenant {settings.tenant!r}: the agent at "
            f"{settings.target} did not answer within {settings.timeout:g} s "
            f"({self.retries} retries; {reason})",
            tenant=settings.tenant,
            bucket=self.attempt.bucket,
            code=self.last[0] if self.last else None,
            details=self.last[1] if self.last else "",
        )

    def failed(self, error: BaseException) -> Optional[float]:
        """Seconds to sleep before sending the same request again, or None if
        the call is over (then `error_for` says with what)."""
        code, details = status_of(error)
        if code in m.RETRIED:
            self.last = (code, details)
            remaining = self.remaining()
            if remaining <= _LAST_ATTEMPT:
                return None
            delay = m.backoff(self.retries)
            self.retries += 1
            # Near the deadline, wait less, so that one more attempt is made
            # before it, with at least _LAST_ATTEMPT to run.
            return min(delay, remaining - _LAST_ATTEMPT)
        return None

    def error_for(self, error: BaseException) -> TollgateError:
        """The error the call ends with after `error`."""
        code, details = status_of(error)
        if code in m.RETRIED or code == grpc.StatusCode.DEADLINE_EXCEEDED:
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.last = (code, details)
            return self.out_of_time()
        return error_from_status(code, details, tenant=self.limiter.tenant, bucket=self.attempt.bucket)


def status_of(error: BaseException) -> Tuple[grpc.StatusCode, str]:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        found = code()
        if isinstance(found, grpc.StatusCode):
            return found, str(details() or "")
    return grpc.StatusCode.UNKNOWN, str(error)


class LimiterSettings:
    """A limiter's tenant and connection settings, and its requests."""

    def __init__(
        self,
        tenant: str,
        *,
        socket: str,
        address: Optional[str],
        token: Optional[str],
        timeout: m.Seconds,
    ) -> None:
        self.tenant = m.text("tenant", tenant)
        self.target = m.target(socket, address, tenant=self.tenant)
        self.metadata = m.metadata(token, tenant=self.tenant)
        self.timeout = m.timeout_seconds(timeout, tenant=self.tenant)
        self.closed = False

    def plan(self, rpc: str, request: object, bucket: Optional[str], *, extra: float = 0.0) -> Attempt:
        if self.closed:
            raise TollgateError(
                f"{rpc} on {bucket_display(bucket)} of tenant {self.tenant!r}: the limiter is closed",
                tenant=self.tenant,
                bucket=bucket,
            )
        return Attempt(rpc=rpc, request=request, bucket=bucket, deadline=time.monotonic() + self.timeout + extra)

    # Requests. Each call that changes a bucket gets a fresh request id,
    # which its retries keep.

    def acquire(self, bucket: str, tokens: float, max_wait: Optional[m.Seconds]) -> Tuple[Attempt, float]:
        bucket = m.text("bucket", bucket)
        amount = m.tokens("tokens", tokens)
        wait = m.seconds("max_wait", max_wait, tenant=self.tenant, bucket=bucket)
        request = agent_pb2.AcquireRequest(
            tenant=self.tenant, bucket=bucket, tokens=amount, request_id=m.new_request_id()
        )
        if wait is not None:
            request.max_wait.CopyFrom(m.duration("max_wait", wait, tenant=self.tenant, bucket=bucket))
        # The wait in the queue does not eat into the timeout, which is for
        # reaching the agent (across a restart, too).
        return self.plan("Acquire", request, bucket, extra=max(wait or 0.0, 0.0)), amount

    def admitted(self, attempt: Attempt, tokens: float, response: agent_pb2.AcquireResponse) -> Admission:
        request = attempt.request
        assert isinstance(request, agent_pb2.AcquireRequest)
        waited = m.from_duration(response.waited)
        if not response.admitted:
            raise NotAdmitted(tenant=self.tenant, bucket=request.bucket, tokens=tokens, waited=waited)
        return Admission(
            tenant=self.tenant,
            bucket=request.bucket,
            tokens=tokens,
            waited=waited,
            fallback=response.fallback,
            request_id=request.request_id,
        )

    def not_admitted_at_deadline(self, attempt: Attempt, tokens: float, started: float) -> NotAdmitted:
        """The agent held the acquisition until the call's own deadline: it
        left the queue and took nothing."""
        request = attempt.request
        assert isinstance(request, agent_pb2.AcquireRequest)
        return NotAdmitted(
            tenant=self.tenant, bucket=request.bucket, tokens=tokens, waited=time.monotonic() - started
        )

    def try_acquire(self, bucket: str, tokens: float) -> Attempt:
        bucket = m.text("bucket", bucket)
        request = agent_pb2.TryAcquireRequest(
            tenant=self.tenant, bucket=bucket, tokens=m.tokens("tokens", tokens), request_id=m.new_request_id()
        )
        return self.plan("TryAcquire", request, bucket)

    def charge(self, bucket: str, tokens: float) -> Attempt:
        bucket = m.text("bucket", bucket)
        request = agent_pb2.ChargeRequest(
            tenant=self.tenant, bucket=bucket, tokens=m.tokens("tokens", tokens), request_id=m.new_request_id()
        )
        return self.plan("Charge", request, bucket)

    def report(
        self,
        *,
        read_requests: int,
        read_bytes: int,
        write_requests: int,
        write_bytes: int,
        cpu_seconds: float,
        egress_bytes: int,
    ) -> Attempt:
        tenant = self.tenant
        request = agent_pb2.ReportRequest(
            tenant=tenant,
            read_requests=m.uint64("read_requests", read_requests, tenant=tenant),
            read_bytes=m.uint64("read_bytes", read_bytes, tenant=tenant),
            write_requests=m.uint64("write_requests", write_requests, tenant=tenant),
            write_bytes=m.uint64("write_bytes", write_bytes, tenant=tenant),
            cpu_seconds=m.tokens("cpu_seconds", cpu_seconds),
            egress_bytes=m.uint64("egress_bytes", egress_bytes, tenant=tenant),
            request_id=m.new_request_id(),
        )
        # Report charges the request-unit bucket.
        return self.plan("Report", request, "")

    def give_back(self, bucket: str, tokens: float) -> Attempt:
        bucket = m.text("bucket", bucket)
        request = agent_pb2.ReturnRequest(
            tenant=self.tenant, bucket=bucket, tokens=m.tokens("tokens", tokens), request_id=m.new_request_id()
        )
        return self.plan("Return", request, bucket)

    def status(self, bucket: str) -> Attempt:
        bucket = m.text("bucket", bucket)
        return self.plan("Status", agent_pb2.StatusRequest(tenant=self.tenant, bucket=bucket), bucket)

    def status_answer(self, attempt: Attempt, response: agent_pb2.StatusResponse) -> m.Status:
        return m.Status.from_response(self.tenant, attempt.bucket or "", response)

    def check_keys(self, items: Iterable[m.KeyCheckItem]) -> Attempt:
        request, bucket = m.check_request(self.tenant, items)
        return self.plan("CheckKeys", request, bucket)

    def check_answer(self, response: key_limits_pb2.CheckResponse) -> m.KeyCheckResult:
        return m.KeyCheckResult.from_response(response)
