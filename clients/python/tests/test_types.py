"""The package's type hints hold: mypy --strict over the package and these
tests (the settings are pyproject.toml's [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def test_the_package_and_its_tests_type_check_strictly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=PACKAGE_ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_installed_package_is_marked_typed() -> None:
    import tollgate_agent

    assert (Path(tollgate_agent.__file__).parent / "py.typed").is_file()
