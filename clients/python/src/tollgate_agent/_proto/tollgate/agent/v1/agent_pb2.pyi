import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from tollgate_agent._proto.tollgate.v1 import key_limits_pb2 as _key_limits_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcquireRequest(_message.Message):
    __slots__ = ("tenant", "bucket", "tokens", "max_wait", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    bucket: str
    tokens: float
    max_wait: _duration_pb2.Duration
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., bucket: _Optional[str] = ..., tokens: _Optional[float] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class TryAcquireRequest(_message.Message):
    __slots__ = ("tenant", "bucket", "tokens", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    bucket: str
    tokens: float
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., bucket: _Optional[str] = ..., tokens: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("admitted", "waited", "fallback")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    waited: _duration_pb2.Duration
    fallback: bool
    def __init__(self, admitted: bool = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fallback: bool = ...) -> None: ...

class ChargeRequest(_message.Message):
    __slots__ = ("tenant", "bucket", "tokens", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    bucket: str
    tokens: float
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., bucket: _Optional[str] = ..., tokens: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class ChargeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("tenant", "read_requests", "read_bytes", "write_requests", "write_bytes", "cpu_seconds", "egress_bytes", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    READ_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EGRESS_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    read_requests: int
    read_bytes: int
    write_requests: int
    write_bytes: int
    cpu_seconds: float
    egress_bytes: int
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., read_requests: _Optional[int] = ..., read_bytes: _Optional[int] = ..., write_requests: _Optional[int] = ..., write_bytes: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., egress_bytes: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("request_units",)
    REQUEST_UNITS_FIELD_NUMBER: _ClassVar[int]
    request_units: float
    def __init__(self, request_units: _Optional[float] = ...) -> None: ...

class ReturnRequest(_message.Message):
    __slots__ = ("tenant", "bucket", "tokens", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    bucket: str
    tokens: float
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., bucket: _Optional[str] = ..., tokens: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReturnResponse(_message.Message):
    __slots__ = ("returned",)
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    returned: float
    def __init__(self, returned: _Optional[float] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("tenant", "bucket")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    bucket: str
    def __init__(self, tenant: _Optional[str] = ..., bucket: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("tokens", "debt", "trickle_rate", "fallback_active", "fallback_rate", "waiters", "queued_tokens", "usage_rate", "instance_id")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEBT_FIELD_NUMBER: _ClassVar[int]
    TRICKLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_RATE_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_RATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    tokens: float
    debt: float
    trickle_rate: float
    fallback_active: bool
    fallback_rate: float
    waiters: int
    queued_tokens: float
    usage_rate: float
    instance_id: int
    def __init__(self, tokens: _Optional[float] = ..., debt: _Optional[float] = ..., trickle_rate: _Optional[float] = ..., fallback_active: bool = ..., fallback_rate: _Optional[float] = ..., waiters: _Optional[int] = ..., queued_tokens: _Optional[float] = ..., usage_rate: _Optional[float] = ..., instance_id: _Optional[int] = ...) -> None: ...
