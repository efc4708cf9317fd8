"""`AsyncLimiter`: the asyncio client of one tenant's buckets on the agent
(grpc.aio), with the same methods, requests and retries as `Limiter`.

A cancelled `acquire` cancels its call: the agent takes the waiter out of
the queue and takes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Any, Awaitable, Callable, Generator, Iterable, Optional, Type

import grpc
import grpc.aio

from tollgate_agent import _messages as m
from tollgate_agent._base import Admission, Attempt, LimiterSettings, Retrying
from tollgate_agent._errors import AgentUnavailable, TollgateError, bucket_display
from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2, agent_pb2_grpc

__all__ = ["AsyncLimiter", "AsyncAcquisition", "PendingAcquisition"]

_log = logging.getLogger("tollgate_agent")


class AsyncAcquisition:
    """Tokens taken by `AsyncLimiter.acquire`; see `Acquisition`.

    As the target of `async with limiter.acquire(...)`, it gives the tokens
    back if the block raises (cancellation included).
    """

    def __init__(self, limiter: AsyncLimiter, admission: Admission) -> None:
        self._limiter = limiter
        self.admission = admission
        #: Tokens given back after the `async with` block raised (None: not given back).
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
            f"AsyncAcquisition(tenant={self.tenant!r}, bucket={self.bucket!r}, tokens={self.tokens:g}, "
            f"waited={self.waited:.6f}, fallback={self.fallback}, returned={self.returned!r})"
        )

    async def _give_back_after(self, exc_type: Type[BaseException]) -> None:
        try:
            self.returned = await self._limiter.give_back(self.bucket, self.tokens)
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


class PendingAcquisition:
    """What `AsyncLimiter.acquire` returns: await it for an
    `AsyncAcquisition`, or use it with `async with`."""

    def __init__(self, call: Callable[[], Awaitable[AsyncAcquisition]]) -> None:
        self._call = call
        self._acquisition: Optional[AsyncAcquisition] = None

    def __await__(self) -> Generator[Any, None, AsyncAcquisition]:
        return self._run().__await__()

    async def _run(self) -> AsyncAcquisition:
        self._acquisition = await self._call()
        return self._acquisition

    async def __aenter__(self) -> AsyncAcquisition:
        return await self._run()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if exc_type is not None and self._acquisition is not None:
            await self._acquisition._give_back_after(exc_type)


class AsyncLimiter:
    """A tenant's buckets on the agent, with coroutines; the same arguments
    and methods as `Limiter`. Make it inside the event loop that uses it."""

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
        self._channel = grpc.aio.insecure_channel(
            self._settings.target, options=m.channel_options(self._settings.target)
        )
        # The generated stub module has no type hints.
        self._stub = agent_pb2_grpc.AgentStub(self._channel)  # type: ignore[no-untyped-call]

    @property
    def tenant(self) -> str:
        return self._settings.tenant

    @property
    def timeout(self) -> float:
        return self._settings.timeout

    def __repr__(self) -> str:
        return f"AsyncLimiter(tenant={self.tenant!r}, target={self._settings.target!r})"

    def acquire(self, bucket: str, tokens: float = 1, *, max_wait: Optional[m.Seconds] = None) -> PendingAcquisition:
        """`await limiter.acquire(...)` or `async with limiter.acquire(...):`;
        see `Limiter.acquire`. Arguments are checked at once; the call is
        made when awaited."""
        attempt, amount = self._settings.acquire(bucket, tokens, max_wait)

        async def call() -> AsyncAcquisition:
            started = time.monotonic()
            try:
                response = await self._invoke(attempt)
            except AgentUnavailable as error:
                if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise self._settings.not_admitted_at_deadline(attempt, amount, started) from None
                raise
            return AsyncAcquisition(self, self._settings.admitted(attempt, amount, response))

        return PendingAcquisition(call)

    async def try_acquire(self, bucket: str, tokens: float = 1) -> bool:
        """Takes `tokens` if the bucket holds them now; never waits."""
        response: agent_pb2.AcquireResponse = await self._invoke(self._settings.try_acquire(bucket, tokens))
        return bool(response.admitted)

    async def charge(self, bucket: str, tokens: float) -> None:
        """Charges `tokens` after the fact; never waits, may put the bucket in debt."""
        await self._invoke(self._settings.charge(bucket, tokens))

    async def report(
        self,
        *,
        read_requests: int = 0,
        read_bytes: int = 0,
        write_requests: int = 0,
        write_bytes: int = 0,
        cpu_seconds: float = 0.0,
        egress_bytes: int = 0,
    ) -> float:
        """Reports key-value work by kind to the request-unit bucket; returns
        what it cost, in request units."""
        response: agent_pb2.ReportResponse = await self._invoke(
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

    async def give_back(self, bucket: str, tokens: float) -> float:
        """Gives back tokens taken for work that did not run; returns how many came back."""
        response: agent_pb2.ReturnResponse = await self._invoke(self._settings.give_back(bucket, tokens))
        return float(response.returned)

    async def status(self, bucket: str) -> m.Status:
        """The agent's local bucket as it is now."""
        attempt = self._settings.status(bucket)
        return self._settings.status_answer(attempt, await self._invoke(attempt))

    async def check_keys(self, items: Iterable[m.KeyCheckItem]) -> m.KeyCheckResult:
        """An exact per-key check, passed to the server as it is; see `Limiter.check_keys`."""
        return self._settings.check_answer(await self._invoke(self._settings.check_keys(items)))

    async def close(self) -> None:
        """Closes the channel, cancelling calls in flight; later calls raise `TollgateError`."""
        self._settings.closed = True
        await self._channel.close(grace=None)

    async def __aenter__(self) -> AsyncLimiter:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self.close()

    async def _invoke(self, attempt: Attempt) -> Any:
        method: Callable[..., Any] = getattr(self._stub, attempt.rpc)
        retrying = Retrying(self._settings, attempt)
        while True:
            try:
                return await method(attempt.request, timeout=retrying.remaining(), metadata=self._settings.metadata)
            except grpc.aio.AioRpcError as error:
                delay = retrying.failed(error)
                if delay is None:
                    raise retrying.error_for(error) from None
                _log.debug("%s on tenant %r: retrying in %.3f s after %s", attempt.rpc, self.tenant, delay, error)
                await asyncio.sleep(delay)
