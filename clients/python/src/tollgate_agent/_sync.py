"""`Limiter`: the blocking client of one tenant's buckets on the agent.

One `Limiter` holds one gRPC channel and may be shared by every thread of
the process. Each call blocks until the agent answers; while the agent is
away (restarting, its socket missing) the call sends the same request again,
same request id, until its timeout, so that a retry is never counted twice.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any, Callable, Iterable, Optional, Type

import grpc

from tollgate_agent import _messages as m
from tollgate_agent._base import Admission, Attempt, LimiterSettings, Retrying
from tollgate_agent._errors import AgentUnavailable, TollgateError, bucket_display
from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2, agent_pb2_grpc

__all__ = ["Limiter", "Acquisition"]

_log = logging.getLogger("tollgate_agent")


class Acquisition:
    """Tokens taken by `Limiter.acquire`.

    Used with `with`, the block is the work the tokens pay for: if it raises,
    the tokens are given back (`Limiter.give_back`, a Return to the agent)
    before the exception goes on, and `returned` says how many came back
    (tokens already reported to the server stay charged). A block that ends
    normally keeps them.
    """

    def __init__(self, limiter: Limiter, admission: Admission) -> None:
        self._limiter = limiter
        self.admission = admission
        #: Tokens given back after the `with` block raised (None: not given back).
        self.returned: Optional[float] = None

    @property
    def tenant(self) -> str:
        return self.admission.tenant

    @property
    def bucket(self) -> str:
        return self.admission.bucket

    @property
    def tokens(self) -> float:
        return self.admission.tokens

    @property
    def waited(self) -> float:
        """Seconds the call waited in the bucket's queue."""
        return self.admission.waited

    @property
    def fallback(self) -> bool:
        """True if the tokens came from the fallback rate (server unreachable)."""
        return self.admission.fallback

    @property
    def request_id(self) -> str:
        return self.admission.request_id

    def __repr__(self) -> str:
        return (
            f"Acquisition(tenant={self.tenant!r}, bucket={self.bucket!r}, tokens={self.tokens:g}, "
            f"waited={self.waited:.6f}, fallback={self.fallback}, returned={self.returned!r})"
        )

    def __enter__(self) -> Acquisition:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if exc_type is None:
            return
        try:
            self.returned = self._limiter.give_back(self.bucket, self.tokens)
        except TollgateError as error:
            # The block's own exception goes on; this one is handled here.
            _log.warning(
                "could not give back %g tokens of %s of tenant %r after the work raised %s: %s",
                self.tokens,
                bucket_display(self.bucket),
                self.tenant,
                exc_type.__name__,
                error,
            )


class Limiter:
    """A tenant's buckets on the agent, with blocking calls.

    `socket` is the agent's Unix socket; `address` (`127.0.0.1:7070`), if
    given, is its TCP listener instead, where `token` is the tenant's token
    (sent as `authorization: Bearer <token>`). `timeout` (seconds, or a
    timedelta) bounds each call, its retries across an agent restart
    included; `acquire` waits in the queue up to `max_wait` on top of it.
    The bucket `""` is the tenant's request-unit bucket.
    """

    def __init__(
        self,
        tenant: str,
        *,
        socket: str = m.DEFAULT_SOCKET,
        address: Optional[str] = None,
        token: Optional[str] = None,
        timeout: m.Seconds = m.DEFAULT_TIMEOUT,
    ) -> None:
        self._settings = LimiterSettings(tenant, socket=socket, address=address, token=token, timeout=timeout)
        self._channel = grpc.insecure_channel(self._settings.target, options=m.channel_options(self._settings.target))
        # The generated stub module has no type hints.
        self._stub = agent_pb2_grpc.AgentStub(self._channel)  # type: ignore[no-untyped-call]

    @property
    def tenant(self) -> str:
        return self._settings.tenant

    @property
    def timeout(self) -> float:
        return self._settings.timeout

    def __repr__(self) -> str:
        return f"Limiter(tenant={self.tenant!r}, target={self._settings.target!r})"

    def acquire(self, bucket: str, tokens: float = 1, *, max_wait: Optional[m.Seconds] = None) -> Acquisition:
        """Waits until `tokens` are in the bucket and takes them all at once
        (first come, first served). Raises `NotAdmitted` if they were not
        there within `max_wait` (None: the agent's --max-wait, and at most
        the timeout); nothing was taken then.

        Returns an `Acquisition`, also a context manager that gives the
        tokens back if its block raises.
        """
        attempt, amount = self._settings.acquire(bucket, tokens, max_wait)
        started = time.monotonic()
        try:
            response = self._invoke(attempt)
        except AgentUnavailable as error:
            if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise self._settings.not_admitted_at_deadline(attempt, amount, started) from None
            raise
        return Acquisition(self, self._settings.admitted(attempt, amount, response))

    def try_acquire(self, bucket: str, tokens: float = 1) -> bool:
        """Takes `tokens` if the bucket holds them now; never waits."""
        response: agent_pb2.AcquireResponse = self._invoke(self._settings.try_acquire(bucket, tokens))
        return bool(response.admitted)

    def charge(self, bucket: str, tokens: float) -> None:
        """Charges `tokens` after the fact (work whose cost is known once
        done): never waits, may put the bucket in debt."""
        self._invoke(self._settings.charge(bucket, tokens))

    def report(
        self,
        *,
        read_requests: int = 0,
        read_bytes: int = 0,
        write_requests: int = 0,
        write_bytes: int = 0,
        cpu_seconds: float = 0.0,
        egress_bytes: int = 0,
    ) -> float:
        """Reports key-value work by kind, priced by the agent's cost model and
        charged to the request-unit bucket; returns what it cost, in request
        units."""
        response: agent_pb2.ReportResponse = self._invoke(
            self._settings.report(
                read_requests=read_requests,
                read_bytes=read_bytes,
                write_requests=write_requests,
                write_bytes=write_bytes,
                cpu_seconds=cpu_seconds,
                egress_bytes=egress_bytes,
            )
        )
        return float(response.request_units)

    def give_back(self, bucket: str, tokens: float) -> float:
        """Gives back tokens taken for work that did not run; returns how many
        came back (tokens already reported to the server stay charged)."""
        response: agent_pb2.ReturnResponse = self._invoke(self._settings.give_back(bucket, tokens))
        return float(response.returned)

    def status(self, bucket: str) -> m.Status:
        """The agent's local bucket as it is now."""
        attempt = self._settings.status(bucket)
        return self._settings.status_answer(attempt, self._invoke(attempt))

    def check_keys(self, items: Iterable[m.KeyCheckItem]) -> m.KeyCheckResult:
        """An exact per-key check, passed to the server as it is: `items` are
        `KeyCheck`s or `(bucket, key[, tokens])` tuples of this tenant, taken
        all together or not at all."""
        return self._settings.check_answer(self._invoke(self._settings.check_keys(items)))

    def close(self) -> None:
        """Closes the channel; later calls raise `TollgateError`."""
        self._settings.closed = True
        self._channel.close()

    def __enter__(self) -> Limiter:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    def _invoke(self, attempt: Attempt) -> Any:
        method: Callable[..., Any] = getattr(self._stub, attempt.rpc)
        retrying = Retrying(self._settings, attempt)
        while True:
            try:
                return method(attempt.request, timeout=retrying.remaining(), metadata=self._settings.metadata)
            except grpc.RpcError as error:
                delay = retrying.failed(error)
                if delay is None:
                    raise retrying.error_for(error) from None
                _log.debug("%s on tenant %r: retrying in %.3f s after %s", attempt.rpc, self.tenant, delay, error)
                time.sleep(delay)
