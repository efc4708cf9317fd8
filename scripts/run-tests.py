#!/usr/bin/env python3
"""Builds every test binary of the workspace, then runs them a few at a time.

`cargo test` runs its test binaries one after another, and many of ours
spend most of their time waiting (servers, PostgreSQL clusters, real
seconds of traffic), so the suite took far longer than the machine's cores
were busy. This runs the same binaries (and the doc tests) `JOBS` at a
time (TOLLGATE_TEST_JOBS, default 2), each from its package's directory as
`cargo test` does, and prints each one's whole output when it ends, under
cargo's own `Running` line, so its `test result:` lines read as cargo's
do. The longest binaries start first: by the durations of the last run
(kept in target/test-durations.json), or on a fresh clone by those of a
run checked in (scripts/test-durations.json). The binaries in `ALONE`
run after the others, one at a time.

    scripts/run-tests.py [--also NAME=COMMAND]... [TEST BINARY ARGUMENTS...]

`--also` runs COMMAND (with bash, from the repository's root) as one more
job of the same pool once the binaries are built, such as a client
package's suite against the binary just built; its output also goes to
target/test-output/NAME.log and its exit status to
target/test-output/NAME.status, for the caller to read.

Exit status: 0 if the build and every binary passed, else 101, with the
failed binaries named at the end (an `--also` command's failure is the
caller's to report).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Binaries whose figures are of the protocol, not of a crowded machine:
# they run after the pool, one at a time. The burst test over real sockets
# measures how evenly identical pods share a burst; beside two other
# binaries on two cores, their round trips were slowed unevenly (a burst
# of 0.6 s took 8.5 s) and the first to be answered took more.
ALONE = {"tollgate: tests/burst_e2e.rs"}
DURATIONS = ROOT / "target" / "test-durations.json"
CHECKED_IN_DURATIONS = ROOT / "scripts" / "test-durations.json"


def build():
    """The test binaries cargo built: (label, command, directory), the
    label naming the package and the target's source, which is also the
    key of its duration."""
    command = [
        "cargo", "test", "--workspace", "--locked", "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    # Diagnostics and progress go to stderr as usual; the artifacts' JSON
    # comes on stdout.
    built = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if built.returncode != 0:
        return None
    binaries = []
    for line in built.stdout.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("reason") != "compiler-artifact":
            continue
        executable = message.get("executable")
        if not executable or not message.get("profile", {}).get("test"):
            continue
        package_dir = Path(message["manifest_path"]).parent
        source = Path(message["target"]["src_path"])
        try:
            source = source.relative_to(package_dir)
        except ValueError:
            pass
        kinds = message["target"]["kind"]
        prefix = "" if kinds == ["test"] else "unittests "
        package = package_dir.name
        label = f"{package}: {prefix}{source}"
        binaries.append((label, [executable], package_dir))
    return binaries


def is_test_binary(command):
    """Whether `command` is a test binary cargo built, not cargo or bash."""
    return command[0] not in ("cargo", "bash")


def run(label, command, directory, args):
    """Runs one binary; its exit status, output and seconds."""
    env = dict(os.environ)
    # A test binary reads its package's directory as cargo test would set
    # it. Cargo itself must not see it: build scripts that watch the
    # variable (ring's) would rebuild, and with them half the workspace.
    if is_test_binary(command):
        env["CARGO_MANIFEST_DIR"] = str(directory)
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        status = subprocess.run(
            command + args, cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
        out.seek(0)
        text = out.read()
    return status, text, time.monotonic() - started


def main():
    args = sys.argv[1:]
    also = []
    while len(args) >= 2 and args[0] == "--also":
        name, _, command = args[1].partition("=")
        also.append((name, command))
        args = args[2:]
    outputs = ROOT / "target" / "test-output"
    outputs.mkdir(parents=True, exist_ok=True)
    for name, _ in also:
        for suffix in (".log", ".status"):
            (outputs / f"{name}{suffix}").unlink(missing_ok=True)
    jobs = max(1, int(os.environ.get("TOLLGATE_TEST_JOBS", "2")))
    binaries = build()
    if binaries is None:
        print("error: the test build failed (see above)")
        return 101
    doc_tests = (
        "doc tests of the workspace",
        ["cargo", "test", "--workspace", "--locked", "--doc", "--", *args],
        ROOT,
    )
    known = {}
    for durations in (DURATIONS, CHECKED_IN_DURATIONS):
        try:
            known = json.loads(durations.read_text())
            break
        except (OSError, json.JSONDecodeError):
            continue
    # The longest first, so the last to end is not a long one started late;
    # the doc tests (compiled as they run) among the first.
    work = [doc_tests] + sorted(binaries, key=lambda b: -known.get(b[0], 0))
    # The other suites first: they take about as long as the longest
    # binaries.
    extra = {name for name, _ in also}
    work = [(name, ["bash", "-c", command], ROOT) for name, command in also] + work
    alone = [w for w in work if w[0] in ALONE]
    work = [w for w in work if w[0] not in ALONE]
    print(f"==> {len(binaries)} test binaries and the doc tests, {jobs} at a time"
          + (f", then {len(alone)} alone" if alone else ""), flush=True)
    failed = []
    durations = {}
    lock = threading.Lock()
    done = 0
    total = len(work) + len(alone)

    def report(label, status, text, seconds):
        nonlocal done
        with lock:
            done += 1
            header = "   Doc-tests" if label == doc_tests[0] else "     Running"
            print(f"{header} {label}", flush=True)
            sys.stdout.write(text)
            if label in extra:
                (outputs / f"{label}.log").write_text(text)
                (outputs / f"{label}.status").write_text(f"{status}\n")
            print(f"==> [{done}/{total}] {label}: {seconds:.0f} s"
                  + ("" if status == 0 else f", exit status {status}"), flush=True)
            if status != 0 and label not in extra:
                failed.append(label)
            if label != doc_tests[0] and label not in extra:
                durations[label] = round(seconds, 1)

    def arguments(command):
        """The test binary arguments go to binaries, not to cargo or bash."""
        return args if is_test_binary(command) else []

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(run, label, command, directory, arguments(command)): label
            for label, command, directory in work
        }
        for future in as_completed(futures):
            report(futures[future], *future.result())
    for label, command, directory in alone:
        report(label, *run(label, command, directory, arguments(command)))
    try:
        DURATIONS.parent.mkdir(parents=True, exist_ok=True)
        DURATIONS.write_text(json.dumps(durations, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass
    if failed:
        print("error: test failed in " + "; ".join(failed))
        return 101
    return 0


if __name__ == "__main__":
    sys.exit(main())
