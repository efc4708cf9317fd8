"""The errors a limiter raises, and the one table from gRPC codes to them.

Callers tell errors apart by class, not by parsing messages: a bucket the
server refused for good (`BucketRefused`) needs an operator, a refused
argument (`InvalidArgument`) is a bug in the caller, an agent that cannot be
reached (`AgentUnavailable`) is an outage, and `NotAdmitted` is the bucket
saying "not now". Every class carries the tenant and the bucket the call
named, so a log line needs nothing else.
"""

from __future__ import annotations

import re
from typing import Optional

import grpc

__all__ = [
    "TollgateError",
    "NotAdmitted",
    "BucketRefused",
    "PermissionDenied",
    "Unauthenticated",
    "InvalidArgument",
    "AgentUnavailable",
    "bucket_display",
]


def bucket_display(bucket: Optional[str]) -> str:
    """How messages name a bucket: the empty name is the request-unit bucket."""
    if bucket is None:
        return "no bucket"
    if bucket == "":
        return "the request-unit bucket"
    return f"bucket {bucket!r}"


class TollgateError(Exception):
    """Base of every error a limiter raises.

    `code` is the gRPC status code of the agent's answer (None for errors
    found before anything was sent); `tenant` and `bucket` are what the call
    named (`report` names the request-unit bucket, `""`, which it charges;
    `bucket` is None for a `check_keys` whose items name several buckets).
    """

    def __init__(
        self,
        message: str,
        *,
        tenant: str,
        bucket: Optional[str] = None,
        code: Optional[grpc.StatusCode] = None,
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tenant = tenant
        self.bucket = bucket
        self.code = code
        self.details = details


class NotAdmitted(TollgateError):
    """The tokens were not in the bucket within the wait; nothing was taken."""

    def __init__(self, *, tenant: str, bucket: str, tokens: float, waited: float) -> None:
        super().__init__(
            f"{tokens:g} tokens of {bucket_display(bucket)} of tenant {tenant!r} "
            f"not admitted after waiting {waited:.3f} s",
            tenant=tenant,
            bucket=bucket,
        )
        self.tokens = tokens
        self.waited = waited


class BucketRefused(TollgateError):
    """The server refused the bucket for good (it does not exist, the tenant is
    suspended or was deleted, the agent may not use it).

    Every call on the bucket fails the same way until the agent restarts:
    retrying does not help, an operator does. `code` says why (NOT_FOUND,
    FAILED_PRECONDITION, PERMISSION_DENIED, ...).
    """


class PermissionDenied(BucketRefused):
    """PERMISSION_DENIED: the tenant may not be used by this caller.

    The code does not say who refused: the agent's access rules (a tenant its
    configuration does not serve to this caller) or the server (the agent's
    own pod token may not act for the tenant). Either way the bucket cannot
    be used, so this is a `BucketRefused`; the message says which.
    """


class Unauthenticated(TollgateError):
    """UNAUTHENTICATED: a TCP caller without the tenant's token (or a wrong one)."""


class InvalidArgument(TollgateError, ValueError):
    """A field out of its documented range; nothing was taken.

    `field` names it (`tokens`, `max_wait`, `items[1].key`), as the agent's
    message does. Also a `ValueError`, as Python's own argument errors are.
    """

    def __init__(
        self,
        message: str,
        *,
        tenant: str,
        bucket: Optional[str] = None,
        field: str,
        code: Optional[grpc.StatusCode] = None,
        details: str = "",
    ) -> None:
        super().__init__(message, tenant=tenant, bucket=bucket, code=code, details=details)
        self.field = field


class AgentUnavailable(TollgateError):
    """The agent could not be reached (or did not answer) within the call's
    timeout, every retry included; whether a call that changes a bucket took
    effect is unknown."""


# The agent's INVALID_ARGUMENT messages open with the field: `tokens: must be
# finite, got NaN`, `items[1].key: ...`.
_FIELD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*)\s*:")

# Codes that refuse the bucket for good (tollgate-client's `classify` table).
_REFUSALS = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


def error_from_status(
    code: grpc.StatusCode,
    details: str,
    *,
    tenant: str,
    bucket: Optional[str],
) -> TollgateError:
    """The error for an answer the call will not retry."""
    what = f"{bucket_display(bucket)} of tenant {tenant!r}" if bucket is not None else f"tenant {tenant!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        match = _FIELD.match(details)
        field = match.group(1) if match else ""
        return InvalidArgument(
            f"invalid argument for {what}: {details}",
            tenant=tenant,
            bucket=bucket,
            field=field,
            code=code,
            details=details,
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(
            f"{what}: unauthenticated: {details}", tenant=tenant, bucket=bucket, code=code, details=details
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(
            f"{what} refused (PERMISSION_DENIED): {details}",
            tenant=tenant,
            bucket=bucket,
            code=code,
            details=details,
        )
    if code in _REFUSALS:
        return BucketRefused(
            f"{what} refused ({code.name}): {details}", tenant=tenant, bucket=bucket, code=code, details=details
        )
    return TollgateError(f"{what}: {code.name}: {details}", tenant=tenant, bucket=bucket, code=code, details=details)
