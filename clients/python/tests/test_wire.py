"""The limiters' requests on the wire, as a recording gRPC server sees them.

The agent's own behaviour is tested against the real agent elsewhere; here
a server of the generated `AgentServicer`, over a real socket, answers as a
test scripts it (UNAVAILABLE twice, then an answer) and records every
request and its metadata, to prove what only the wire shows: a fresh
request id per call, the same one on every retry, the bearer token, the
wait sent as a Duration.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import grpc
import pytest

from tollgate_agent import (
    AgentUnavailable,
    AsyncLimiter,
    BucketRefused,
    InvalidArgument,
    Limiter,
    NotAdmitted,
)
from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2, agent_pb2_grpc
from tollgate_agent._proto.tollgate.v1 import key_limits_pb2


@dataclass
class Received:
    rpc: str
    request: Any
    metadata: Dict[str, str]


@dataclass
class Recorder(agent_pb2_grpc.AgentServicer):
    """Answers each RPC after failing it with the scripted codes, in order."""

    failures: List[Tuple[grpc.StatusCode, str]] = field(default_factory=list)
    hold: float = 0.0
    received: List[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, rpc: str, request: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.received.append(Received(rpc, request, {k: str(v) for k, v in context.invocation_metadata()}))
            failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            context.abort(failure[0], failure[1])
        if self.hold:
            time.sleep(self.hold)

    def Acquire(self, request: agent_pb2.AcquireRequest, context: grpc.ServicerContext) -> agent_pb2.AcquireResponse:
        self._record("Acquire", request, context)
        return agent_pb2.AcquireResponse(admitted=True)

    def TryAcquire(
        self, request: agent_pb2.TryAcquireRequest, context: grpc.ServicerContext
    ) -> agent_pb2.AcquireResponse:
        self._record("TryAcquire", request, context)
        return agent_pb2.AcquireResponse(admitted=True)

    def Charge(self, request: agent_pb2.ChargeRequest, context: grpc.ServicerContext) -> agent_pb2.ChargeResponse:
        self._record("Charge", request, context)
        return agent_pb2.ChargeResponse()

    def Report(self, request: agent_pb2.ReportRequest, context: grpc.ServicerContext) -> agent_pb2.ReportResponse:
        self._record("Report", request, context)
        return agent_pb2.ReportResponse(request_units=1.5)

    def Return(self, request: agent_pb2.ReturnRequest, context: grpc.ServicerContext) -> agent_pb2.ReturnResponse:
        self._record("Return", request, context)
        return agent_pb2.ReturnResponse(returned=request.tokens)

    def Status(self, request: agent_pb2.StatusRequest, context: grpc.ServicerContext) -> agent_pb2.StatusResponse:
        self._record("Status", request, context)
        return agent_pb2.StatusResponse()

    def CheckKeys(
        self, request: key_limits_pb2.CheckRequest, context: grpc.ServicerContext
    ) -> key_limits_pb2.CheckResponse:
        self._record("CheckKeys", request, context)
        return key_limits_pb2.CheckResponse(
            allowed=True, answers=[key_limits_pb2.CheckAnswer(allowed=True) for _ in request.items]
        )


@dataclass
class Recording:
    recorder: Recorder
    socket: str
    address: str

    def request_ids(self) -> List[str]:
        return [received.request.request_id for received in self.recorder.received]


@pytest.fixture
def recording() -> Iterator[Recording]:
    recorder = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServicer_to_server(recorder, server)  # type: ignore[no-untyped-call]
    directory = tempfile.mkdtemp(prefix="tollgate-wire-")
    socket = os.path.join(directory, "agent.sock")
    server.add_insecure_port(f"unix:{socket}")
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield Recording(recorder, socket, f"127.0.0.1:{port}")
    finally:
        server.stop(grace=None)
        shutil.rmtree(directory, ignore_errors=True)


def test_each_call_that_changes_a_bucket_sends_a_fresh_request_id(recording: Recording) -> None:
    with Limiter("t1", socket=recording.socket) as limiter:
        for _ in range(2):
            limiter.acquire("schedule-email", 5)
            limiter.try_acquire("schedule-email", 5)
            limiter.charge("schedule-email", 5)
            limiter.give_back("schedule-email", 5)
            limiter.report(read_requests=1)
    ids = recording.request_ids()
    assert len(ids) == 10
    assert len(set(ids)) == 10
    for request_id in ids:
        assert uuid.UUID(request_id).version == 4


def test_unavailable_and_aborted_are_retried_with_the_same_request_id(recording: Recording) -> None:
    recording.recorder.failures = [
        (grpc.StatusCode.UNAVAILABLE, "agent restarting"),
        (grpc.StatusCode.ABORTED, "request id still in progress"),
        (grpc.StatusCode.UNAVAILABLE, "agent restarting"),
    ]
    with Limiter("t1", socket=recording.socket) as limiter:
        limiter.charge("schedule-email", 7)
    received = recording.recorder.received
    assert [r.rpc for r in received] == ["Charge"] * 4
    assert len(set(recording.request_ids())) == 1
    assert all(r.request.tokens == 7 for r in received)


def test_retries_end_at_the_timeout_with_agent_unavailable(recording: Recording) -> None:
    recording.recorder.failures = [(grpc.StatusCode.UNAVAILABLE, "agent restarting")] * 1000
    started = time.monotonic()
    with Limiter("t1", socket=recording.socket, timeout=0.8) as limiter:
        with pytest.raises(AgentUnavailable) as raised:
            limiter.acquire("schedule-email", 3)
    elapsed = time.monotonic() - started
    assert 0.7 <= elapsed < 3.0
    assert len(recording.recorder.received) >= 3
    assert len(set(recording.request_ids())) == 1
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    assert "schedule-email" in str(raised.value) and "agent restarting" in str(raised.value)


def test_a_missing_socket_is_retried_until_the_timeout(tmp_path: Path) -> None:
    socket = str(tmp_path / "absent.sock")
    started = time.monotonic()
    with Limiter("t1", socket=socket, timeout=0.5) as limiter:
        with pytest.raises(AgentUnavailable) as raised:
            limiter.charge("schedule-email", 1)
    assert 0.4 <= time.monotonic() - started < 3.0
    assert socket in str(raised.value)


def test_answers_that_are_final_are_not_retried(recording: Recording) -> None:
    recording.recorder.failures = [
        (grpc.StatusCode.INVALID_ARGUMENT, "tokens: must be finite, got NaN"),
        (grpc.StatusCode.NOT_FOUND, 'tenant "t1" has no bucket "schedule-emial"'),
    ]
    with Limiter("t1", socket=recording.socket) as limiter:
        with pytest.raises(InvalidArgument) as invalid:
            limiter.charge("schedule-email", 1)
        with pytest.raises(BucketRefused) as refused:
            limiter.charge("schedule-emial", 1)
    assert invalid.value.field == "tokens"
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert refused.value.bucket == "schedule-emial"
    assert len(recording.recorder.received) == 2


def test_the_token_is_sent_as_a_bearer_token(recording: Recording) -> None:
    with Limiter("t1", address=recording.address, token="tenant-token-1") as limiter:
        limiter.status("")
    with Limiter("t1", address=recording.address) as limiter:
        limiter.status("")
    with_token, without = recording.recorder.received
    assert with_token.metadata.get("authorization") == "Bearer tenant-token-1"
    assert "authorization" not in without.metadata


def test_max_wait_is_sent_as_a_duration_and_left_unset_by_default(recording: Recording) -> None:
    with Limiter("t1", socket=recording.socket) as limiter:
        limiter.acquire("", 2, max_wait=timedelta(milliseconds=1500))
        limiter.acquire("", 2, max_wait=0.25)
        limiter.acquire("", 2)
    first, second, third = (r.request for r in recording.recorder.received)
    assert (first.max_wait.seconds, first.max_wait.nanos) == (1, 500_000_000)
    assert (second.max_wait.seconds, second.max_wait.nanos) == (0, 250_000_000)
    assert not third.HasField("max_wait")


def test_an_acquire_past_its_deadline_is_not_admitted(recording: Recording) -> None:
    recording.recorder.hold = 2.0
    with Limiter("t1", socket=recording.socket, timeout=0.3) as limiter:
        with pytest.raises(NotAdmitted) as raised:
            limiter.acquire("schedule-email", 4)
    assert raised.value.tokens == 4
    assert raised.value.bucket == "schedule-email"
    assert 0.25 <= raised.value.waited < 2.0


def test_async_calls_retry_with_the_same_request_id(recording: Recording) -> None:
    recording.recorder.failures = [(grpc.StatusCode.UNAVAILABLE, "agent restarting")] * 2

    async def run() -> Optional[float]:
        async with AsyncLimiter("t1", socket=recording.socket) as limiter:
            async with limiter.acquire("schedule-email", 9) as acquisition:
                pass
            return acquisition.returned

    assert asyncio.run(run()) is None
    assert [r.rpc for r in recording.recorder.received] == ["Acquire"] * 3
    assert len(set(recording.request_ids())) == 1


def test_check_keys_gives_each_item_a_request_id(recording: Recording) -> None:
    with Limiter("t1", socket=recording.socket) as limiter:
        result = limiter.check_keys([("api-calls-per-user", "user-1"), ("api-calls-per-user", "user-2", 3)])
    assert result.allowed and len(result.answers) == 2
    (received,) = recording.recorder.received
    items = received.request.items
    assert [(i.tenant_id, i.bucket, i.key, i.tokens) for i in items] == [
        ("t1", "api-calls-per-user", "user-1", 1.0),
        ("t1", "api-calls-per-user", "user-2", 3.0),
    ]
    assert items[0].request_id and items[1].request_id and items[0].request_id != items[1].request_id
