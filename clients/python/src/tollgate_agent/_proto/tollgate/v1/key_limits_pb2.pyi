import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[CheckItem]
    def __init__(self, items: _Optional[_Iterable[_Union[CheckItem, _Mapping]]] = ...) -> None: ...

class CheckItem(_message.Message):
    __slots__ = ("tenant_id", "bucket", "key", "tokens", "request_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    bucket: str
    key: str
    tokens: float
    request_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ..., tokens: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("allowed", "answers")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    answers: _containers.RepeatedCompositeFieldContainer[CheckAnswer]
    def __init__(self, allowed: bool = ..., answers: _Optional[_Iterable[_Union[CheckAnswer, _Mapping]]] = ...) -> None: ...

class CheckAnswer(_message.Message):
    __slots__ = ("allowed", "remaining_tokens", "retry_after", "reset_after", "refill_rate", "burst_limit", "replayed", "quota_remaining", "quota_resets_at", "shadow_refused")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_FIELD_NUMBER: _ClassVar[int]
    REFILL_RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REMAINING_FIELD_NUMBER: _ClassVar[int]
    QUOTA_RESETS_AT_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REFUSED_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    remaining_tokens: float
    retry_after: _duration_pb2.Duration
    reset_after: _duration_pb2.Duration
    refill_rate: float
    burst_limit: float
    replayed: bool
    quota_remaining: float
    quota_resets_at: _timestamp_pb2.Timestamp
    shadow_refused: bool
    def __init__(self, allowed: bool = ..., remaining_tokens: _Optional[float] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reset_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., refill_rate: _Optional[float] = ..., burst_limit: _Optional[float] = ..., replayed: bool = ..., quota_remaining: _Optional[float] = ..., quota_resets_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., shadow_refused: bool = ...) -> None: ...
