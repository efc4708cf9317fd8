"""A real Tollgate server and real agents for the tests.

The server is `tollgate serve` on an embedded store in a temporary
directory, listening on a port of its own; tenants are made with the
`tollgate tenant` and `tollgate tier` commands, as an operator would. Agents
are `tollgate agent` processes talking to it, on Unix sockets (and a
loopback TCP port, for the access tests). The binary is the one the
environment variable TOLLGATE_BIN names (test.sh sets it).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import grpc
import pytest

from tollgate_agent import Limiter

# The tier every test tenant is on: a shared bucket and a per-key bucket.
TIERS = """
[tiers.pytest.buckets.schedule-email]
refill_rate = 10
burst_limit = 100

[tiers.pytest.buckets.send-invoice]
refill_rate = 0.5
burst_limit = 100

[tiers.pytest.buckets.api-calls-per-user]
kind = "per-key"
refill_rate = 5
burst_limit = 50
"""

SHARED_BUCKET = "schedule-email"
# A shared bucket that refills slowly: drained, it takes 10 s to bring 5
# tokens, so a test that needs an acquisition not to be admitted in time
# holds however slowly the machine runs.
SLOW_BUCKET = "send-invoice"
PER_KEY_BUCKET = "api-calls-per-user"

_STARTUP_TIMEOUT = 30.0
_tenant_numbers = itertools.count(1)
_agent_numbers = itertools.count(1)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log: {error})"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _stop(process: "subprocess.Popen[bytes]", sig: int, timeout: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class Server:
    """`tollgate serve` on an embedded store in `directory`."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.log = directory / "server.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    "serve",
                    "--store",
                    str(directory / "store.redb"),
                    "--create",
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics-listen",
                    "off",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://{self._wait_for_address()}"

    def _wait_for_address(self) -> str:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(r"tollgate server listening address=(\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"tollgate serve did not start; its log:\n{_tail(self.log)}")

    def command(self, *args: str) -> str:
        """Runs `tollgate ARGS --server URL` and returns its stdout."""
        done = subprocess.run(
            [self.binary, *args, "--server", self.url],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tollgate {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def new_tenant(self, *, available: float = 1000, refill_rate: float = 100, burst_limit: float = 1000) -> str:
        """A new tenant on the test tier (`schedule-email`: 10 tokens/s, burst
        100; per-key `api-calls-per-user`: 5/s, burst 50), whose request-unit
        bucket has the given limits."""
        tenant = f"py{os.getpid()}-{next(_tenant_numbers)}"
        self.command("tenant", "create", "--tenant", tenant, "--tier", "pytest")
        self.command(
            "tenant",
            "set-limits",
            "--tenant",
            tenant,
            "--available",
            f"{available:g}",
            "--refill-rate",
            f"{refill_rate:g}",
            "--burst-limit",
            f"{burst_limit:g}",
        )
        return tenant

    def bucket(self, tenant: str, bucket: str) -> Dict[str, Any]:
        """The server's view of one bucket (`tenant show --json`)."""
        args = ["tenant", "show", "--tenant", tenant, "--json"]
        if bucket:
            args += ["--bucket", bucket]
        shown = json.loads(self.command(*args))
        rows: List[Dict[str, Any]] = shown if isinstance(shown, list) else [shown]
        for row in rows:
            if row.get("bucket") == bucket:
                return row
        raise AssertionError(f"no bucket {bucket!r} in {shown!r}")

    def stop(self) -> None:
        _stop(self.process, signal.SIGTERM, 30)


class Agent:
    """`tollgate agent` against `server`, on a Unix socket in `directory`
    (and on `listen`, with the access file `access`, if given)."""

    def __init__(
        self,
        binary: str,
        server: Server,
        directory: Path,
        *,
        listen: Optional[str] = None,
        access: Optional[Path] = None,
    ) -> None:
        self.binary = binary
        self.server = server
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        # Unix socket paths are short (108 bytes): not under pytest's tmp_path.
        self.socket_dir = tempfile.mkdtemp(prefix="tollgate-agent-")
        self.socket = os.path.join(self.socket_dir, "agent.sock")
        self.state_dir = directory / "state"
        self.node_name = f"pytest-{os.getpid()}-{next(_agent_numbers)}"
        self.listen = listen
        self.access = access
        self.log = directory / "agent.log"
        self.process: Optional["subprocess.Popen[bytes]"] = None
        self.start()

    def start(self) -> None:
        args = [
            self.binary,
            "agent",
            "--server",
            self.server.url,
            "--socket",
            self.socket,
            "--state-dir",
            str(self.state_dir),
            # Agents of one host would share an instance id (derived from the
            # host name); each test agent is a node of its own.
            "--node-name",
            self.node_name,
        ]
        if self.listen is not None:
            args += ["--listen", self.listen]
        if self.access is not None:
            args += ["--access", str(self.access)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_serving()

    def _wait_until_serving(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        targets = [f"unix:{self.socket}"] + ([self.listen] if self.listen else [])
        for target in targets:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"tollgate agent exited with {self.process.returncode}; its log:\n{_tail(self.log)}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"tollgate agent not serving on {target}; its log:\n{_tail(self.log)}")
                with grpc.insecure_channel(target) as channel:
                    try:
                        grpc.channel_ready_future(channel).result(timeout=min(remaining, 1.0))
                        break
                    except grpc.FutureTimeoutError:
                        continue

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final report."""
        assert self.process is not None
        _stop(self.process, signal.SIGKILL, 10)

    def stop(self) -> None:
        """SIGTERM: the agent reports every bucket's consumption and stops."""
        assert self.process is not None
        _stop(self.process, signal.SIGTERM, 60)
        assert self.process.returncode == 0, f"agent exited with {self.process.returncode}:\n{_tail(self.log)}"

    def close(self) -> None:
        if self.process is not None:
            _stop(self.process, signal.SIGTERM, 30)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def consumed(server: Server, tenant: str, bucket: str) -> float:
    """The tokens the server has counted as consumed from a bucket."""
    value = server.bucket(tenant, bucket)["consumption"]["request_units"]
    return float(value)


def server_is_dry(server: Server, tenant: str, bucket: str) -> bool:
    """Whether the tenant's global bucket holds under 5 tokens."""
    return float(server.bucket(tenant, bucket)["current_tokens"]) < 5


def drain(limiter: Limiter, server: Server, bucket: str) -> float:
    """Takes every token the agent holds for `bucket`, and returns how many.

    A bucket the agent starts holds tollgate-client's initial allowance (10
    tokens) and then the server's grants; once it has
    taken them all, the tenant's global bucket is in debt and tokens come
    back at no more than its refill rate. Drained means under 5 tokens,
    twice, 0.3 s apart, then under 5 in the server's global bucket (a grant
    still on its way to the agent is not drained yet), then under 5 in the
    agent once more (what trickled in meanwhile is not drained either).
    """
    taken = 0.0
    quiet_since: Optional[float] = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        held = math.floor(limiter.status(bucket).tokens)
        if held >= 5:
            quiet_since = None
            if limiter.try_acquire(bucket, held):
                taken += held
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 0.3:
            # The server's bucket first, then the agent's again: what
            # trickled in while the server was asked is not drained yet.
            if server_is_dry(server, limiter.tenant, bucket) and limiter.status(bucket).tokens < 5:
                return taken
            quiet_since = None
        else:
            time.sleep(0.05)
    raise AssertionError(f"{bucket!r} of {limiter.tenant!r} never ran dry")


@pytest.fixture(scope="session")
def tollgate_bin() -> str:
    binary = os.environ.get("TOLLGATE_BIN", "")
    if not binary or not os.access(binary, os.X_OK):
        raise RuntimeError(
            f"TOLLGATE_BIN must name the tollgate binary (got {binary!r}); clients/python/test.sh sets it"
        )
    return binary


@pytest.fixture(scope="session")
def server(tollgate_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("server")
    running = Server(tollgate_bin, directory)
    try:
        tiers = directory / "tiers.toml"
        tiers.write_text(TIERS)
        running.command("tier", "apply", "-f", str(tiers), "--yes")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def agent(tollgate_bin: str, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent on a Unix socket, shared by the tests (each has its own tenant)."""
    running = Agent(tollgate_bin, server, tmp_path_factory.mktemp("agent"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def own_agent(tollgate_bin: str, server: Server, tmp_path: Path) -> Iterator[Agent]:
    """An agent of the test's own, which it may kill, restart or stop."""
    running = Agent(tollgate_bin, server, tmp_path / "agent")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def tenant(server: Server) -> str:
    return server.new_tenant()
