"""The committed modules of `tollgate_agent._proto` are what generate.sh
makes from the proto now: a change of agent.proto (or key_limits.proto)
without regenerating them fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
COMMITTED = PACKAGE_ROOT / "src" / "tollgate_agent" / "_proto"


def _files(root: Path) -> Dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    subprocess.run(
        ["bash", str(PACKAGE_ROOT / "generate.sh"), str(out)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    generated = _files(out)
    committed = _files(COMMITTED)
    assert sorted(generated) == sorted(committed), "files differ: run clients/python/generate.sh"
    stale = [name for name in generated if generated[name] != committed[name]]
    assert not stale, f"stale generated modules {stale}: run clients/python/generate.sh"


def test_the_generated_modules_are_the_ones_the_package_imports() -> None:
    from tollgate_agent._proto.tollgate.agent.v1 import agent_pb2

    assert Path(agent_pb2.__file__).name == "agent_pb2.py"
    assert agent_pb2.DESCRIPTOR.name == "tollgate/agent/v1/agent.proto"
    assert [m.name for m in agent_pb2.DESCRIPTOR.services_by_name["Agent"].methods] == [
        "Acquire",
        "TryAcquire",
        "Charge",
        "Report",
        "Return",
        "Status",
        "CheckKeys",
    ]
