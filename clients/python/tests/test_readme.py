"""Every Python example of README.md runs against a real agent, each with a
tenant of its own in place of `t1234` and the agent's socket in place of
`/run/tollgate/agent.sock`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Agent, Server

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
EXAMPLES = re.findall(r"^```python\n(.*?)^```", README, re.DOTALL | re.MULTILINE)


def test_the_readme_has_its_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("number", range(1, len(EXAMPLES) + 1))
def test_readme_example_runs(number: int, agent: Agent, server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    tenant = server.new_tenant()
    code = EXAMPLES[number - 1].replace("/run/tollgate/agent.sock", agent.socket).replace('"t1234"', f'"{tenant}"')
    assert code != EXAMPLES[number - 1]
    exec(compile(code, f"README.md, example {number}", "exec"), {"__name__": f"readme_example_{number}"})
    assert capsys.readouterr().out, "the example printed nothing"
