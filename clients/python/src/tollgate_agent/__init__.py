"""Python client of the Tollgate agent: gate work on a tenant's shared buckets.

`tollgate agent` runs beside the pods and holds their local buckets,
refilled from the Tollgate server; this package is a thin client of its gRPC
API (`proto/tollgate/agent/v1/agent.proto`, from which `_proto` is
generated). Every decision is the agent's: nothing here counts tokens.

    from tollgate_agent import Limiter

    limiter = Limiter("t1234")
    with limiter.acquire("schedule-email", 50):
        send_emails()
"""

from tollgate_agent._async import AsyncAcquisition, AsyncLimiter, PendingAcquisition
from tollgate_agent._base import Admission
from tollgate_agent._errors import (
    AgentUnavailable,
    BucketRefused,
    InvalidArgument,
    NotAdmitted,
    PermissionDenied,
    TollgateError,
    Unauthenticated,
)
from tollgate_agent._messages import DEFAULT_SOCKET, DEFAULT_TIMEOUT, KeyAnswer, KeyCheck, KeyCheckResult, Status
from tollgate_agent._sync import Acquisition, Limiter

__all__ = [
    "Acquisition",
    "Admission",
    "AgentUnavailable",
    "AsyncAcquisition",
    "AsyncLimiter",
    "BucketRefused",
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT",
    "InvalidArgument",
    "KeyAnswer",
    "KeyCheck",
    "KeyCheckResult",
    "Limiter",
    "NotAdmitted",
    "PendingAcquisition",
    "PermissionDenied",
    "Status",
    "TollgateError",
    "Unauthenticated",
]
