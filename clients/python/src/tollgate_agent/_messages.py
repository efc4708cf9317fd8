"""Python values to the agent's messages and back, and the retry schedule,
shared by the sync and the asyncio limiters.

Nothing here decides anything about a bucket: ranges are the agent's to
check (it names the field it refuses). Only what the wire cannot carry is
refused here, naming the field the same way: a text that is not a `str`, a
count that does not fit a uint64, a wait that is not a finite duration.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf.duration_pb2 import Duration

from tollgate_agent._errors import InvalidArgument
from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2
from tollgate_agent._proto.tollgate.v1 import key_limits_pb2

DEFAULT_SOCKET = "/run/tollgate/agent.sock"
DEFAULT_TIMEOUT = 30.0

# Answers after which the same request (same request id) is sent again: the
# agent restarting or not there yet (UNAVAILABLE), or the same request id
# still being served by an earlier attempt (ABORTED).
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})

# Reconnect quickly after the agent comes back: gRPC's default backoff grows
# to two minutes, far beyond a call's timeout.
_RECONNECT_OPTIONS: Tuple[Tuple[str, Union[int, str]], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 1.0
_UINT64_MAX = 2**64 - 1
# google.protobuf.Duration's range.
_MAX_DURATION_SECONDS = 315_576_000_000

Seconds = Union[float, int, timedelta]


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first):
    doubling from 50 ms to 1 s, jittered so that callers of one restarted
    agent do not all come back at once."""
    ceiling = min(_MAX_BACKOFF, _FIRST_BACKOFF * 2.0 ** min(attempt, 16))
    return ceiling * random.uniform(0.5, 1.0)


def new_request_id() -> str:
    return str(uuid.uuid4())


def target(socket: str, address: Optional[str], *, tenant: str) -> str:
    """The gRPC target: `address` (host:port) if given, else the Unix socket."""
    if address is not None:
        text("address", address)
        if not address:
            raise InvalidArgument("address: must not be empty", tenant=tenant, field="address")
        return address
    text("socket", socket)
    if not socket:
        raise InvalidArgument("socket: must not be empty", tenant=tenant, field="socket")
    return socket if socket.startswith("unix:") else f"unix:{socket}"


def channel_options(target: str) -> Sequence[Tuple[str, Union[int, str]]]:
    """The channel's options for `target`.

    Over a Unix socket, gRPC's C core sends the socket's path as the HTTP/2
    `:authority`, which is not a valid authority: the agent's HTTP/2 stack
    (hyper's h2, as every tonic server's) resets such streams with
    PROTOCOL_ERROR. `localhost` is the convention for Unix sockets (grpc-go,
    Kubernetes, h2's own client).
    """
    if target.startswith("unix:"):
        return _RECONNECT_OPTIONS + (("grpc.default_authority", "localhost"),)
    return _RECONNECT_OPTIONS


def metadata(token: Optional[str], *, tenant: str) -> Optional[Tuple[Tuple[str, str], ...]]:
    """The call metadata: the tenant's token as a bearer token, if given."""
    if token is None:
        return None
    text("token", token)
    if not token:
        raise InvalidArgument(
            "token: must not be empty (None sends no token)", tenant=tenant, field="token"
        )
    return (("authorization", f"Bearer {token}"),)


def timeout_seconds(timeout: Seconds, *, tenant: str) -> float:
    value = seconds("timeout", timeout, tenant=tenant)
    if value is None or value <= 0:
        raise InvalidArgument(
            f"timeout: must be more than 0 seconds, got {timeout!r}", tenant=tenant, field="timeout"
        )
    return value


def text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field}: must be a str, got {type(value).__name__}")
    return value


def tokens(field: str, value: object) -> float:
    """Tokens as the wire's double; their range (finite, 0 to 1e15) is the
    agent's to check."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field}: must be a number, got {type(value).__name__}")
    return float(value)


def uint64(field: str, value: object, *, tenant: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if not 0 <= value <= _UINT64_MAX:
        raise InvalidArgument(
            f"{field}: must be 0 to 2^64-1, got {value}", tenant=tenant, bucket=None, field=field
        )
    return value


def seconds(field: str, value: Optional[Seconds], *, tenant: str, bucket: Optional[str] = None) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field}: must be seconds (a number) or a timedelta, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidArgument(f"{field}: must be finite, got {value}", tenant=tenant, bucket=bucket, field=field)
    return float(value)


def duration(field: str, value: float, *, tenant: str, bucket: Optional[str]) -> Duration:
    """A Duration for `value` seconds; a negative one is sent as it is, for the
    agent to refuse."""
    if abs(value) > _MAX_DURATION_SECONDS:
        raise InvalidArgument(
            f"{field}: must be at most {_MAX_DURATION_SECONDS} seconds, got {value}",
            tenant=tenant,
            bucket=bucket,
            field=field,
        )
    whole = math.trunc(value)
    nanos = round((value - whole) * 1e9)
    if abs(nanos) >= 1_000_000_000:
        whole += 1 if nanos > 0 else -1
        nanos = 0
    return Duration(seconds=whole, nanos=nanos)


def from_duration(value: Duration) -> float:
    return value.seconds + value.nanos / 1e9


@dataclass(frozen=True)
class Status:
    """A bucket as the agent holds it now (the agent's `StatusResponse`)."""

    tenant: str
    bucket: str
    #: Tokens in the local bucket now.
    tokens: float
    #: Tokens owed for work charged after the fact.
    debt: float
    #: Tokens per second arriving from the server's last grant (0 if none).
    trickle_rate: float
    #: True while the server cannot be reached and the bucket refills at `fallback_rate`.
    fallback_active: bool
    fallback_rate: float
    #: Acquisitions waiting, and the tokens they wait for.
    waiters: int
    queued_tokens: float
    #: The bucket's recent use, tokens per second.
    usage_rate: float
    #: The agent's instance id for the tenant's buckets.
    instance_id: int

    @classmethod
    def from_response(cls, tenant: str, bucket: str, response: agent_pb2.StatusResponse) -> Status:
        return cls(
            tenant=tenant,
            bucket=bucket,
            tokens=response.tokens,
            debt=response.debt,
            trickle_rate=response.trickle_rate,
            fallback_active=response.fallback_active,
            fallback_rate=response.fallback_rate,
            waiters=response.waiters,
            queued_tokens=response.queued_tokens,
            usage_rate=response.usage_rate,
            instance_id=response.instance_id,
        )


@dataclass(frozen=True)
class KeyCheck:
    """One item of `check_keys`: `tokens` from `key` of the tenant's per-key
    bucket `bucket` (0 tokens reads the key and takes nothing)."""

    bucket: str
    key: str
    tokens: float = 1.0


@dataclass(frozen=True)
class KeyAnswer:
    """The server's answer for one item of `check_keys`."""

    #: True if this item's tokens were taken.
    allowed: bool
    #: Tokens the key holds after the check.
    remaining_tokens: float
    #: Seconds until the tokens asked for are there: 0 if allowed; None if never.
    retry_after: Optional[float]
    #: Seconds until the key is full again: 0 if it is; None if never.
    reset_after: Optional[float]
    refill_rate: float
    burst_limit: float
    #: True if a retry was answered from the first check's record.
    replayed: bool


@dataclass(frozen=True)
class KeyCheckResult:
    """All items taken, or none. True in a boolean context when allowed."""

    allowed: bool
    answers: Tuple[KeyAnswer, ...]

    def __bool__(self) -> bool:
        return self.allowed

    @classmethod
    def from_response(cls, response: key_limits_pb2.CheckResponse) -> KeyCheckResult:
        return cls(
            allowed=response.allowed,
            answers=tuple(
                KeyAnswer(
                    allowed=answer.allowed,
                    remaining_tokens=answer.remaining_tokens,
                    retry_after=from_duration(answer.retry_after) if answer.HasField("retry_after") else None,
                    reset_after=from_duration(answer.reset_after) if answer.HasField("reset_after") else None,
                    refill_rate=answer.refill_rate,
                    burst_limit=answer.burst_limit,
                    replayed=answer.replayed,
                )
                for answer in response.answers
            ),
        )


KeyCheckItem = Union[KeyCheck, Tuple[str, str], Tuple[str, str, float]]


def check_request(tenant: str, items: Iterable[KeyCheckItem]) -> Tuple[key_limits_pb2.CheckRequest, Optional[str]]:
    """The CheckRequest for `items`, each with a request id of its own (one
    call's ids share a prefix), and the one bucket they all name (None if
    they name several)."""
    request = key_limits_pb2.CheckRequest()
    call_id = new_request_id()
    buckets = set()
    for index, item in enumerate(items):
        if isinstance(item, KeyCheck):
            check = item
        elif isinstance(item, tuple) and len(item) in (2, 3):
            check = KeyCheck(*item)
        else:
            raise TypeError(f"items[{index}]: must be a KeyCheck or a (bucket, key[, tokens]) tuple")
        buckets.add(text(f"items[{index}].bucket", check.bucket))
        request.items.append(
            key_limits_pb2.CheckItem(
                tenant_id=tenant,
                bucket=check.bucket,
                key=text(f"items[{index}].key", check.key),
                tokens=tokens(f"items[{index}].tokens", check.tokens),
                request_id=f"{call_id}/{index}",
            )
        )
    return request, (buckets.pop() if len(buckets) == 1 else None)
