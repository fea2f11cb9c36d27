"""The test kit's speed: the wall-clock time of the examples' tests and of the kit's own (days of
sleeps, waits and escalations on a virtual clock), as a user's ``pytest`` runs them — one process,
no server — and of the project's unit tier (``pytest -m unit``: its engine tests, on the kit).

Runs ``pytest -m unit examples tests/unit/test_testing_kit.py`` in a subprocess (no xdist, in file
order; SQLite, as a user's tests run by default),
reads each test's time from its JUnit report, prints them and the whole run's wall clock; then
``pytest -m unit -n 2`` as scripts/test runs it; and writes ``bench/results/kit-<date>.json``.
Usage: ``python -m bench.kit [--out DIR]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path
from typing import Any

from bench.throughput import REPO, RESULTS, machine, record

TESTS = ["examples", "tests/unit/test_testing_kit.py"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-unit-tier", action="store_true",
                        help="leave out the unit tier's timing (its own minute of two cores)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:randomly", "-m", "unit",
                        f"--junitxml={report}", *TESTS], cwd=REPO, check=True, capture_output=True)
        wall = time.perf_counter() - started
        cases = ET.parse(report).getroot().iter("testcase")
        times = {f"{case.get('classname')}::{case.get('name')}": float(case.get("time", 0)) for case in cases}
    by_file: dict[str, float] = {}
    for test, seconds in times.items():
        by_file[test.split("::")[0]] = by_file.get(test.split("::")[0], 0.0) + seconds
    for test, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{seconds * 1000:8.0f} ms  {test}")
    print(f"{len(times)} tests: {sum(times.values()):.2f} s in the tests, {wall:.2f} s for the whole pytest run "
          "(start-up and imports included)")
    unit = None if args.no_unit_tier else unit_tier()
    if unit is not None:
        print(f"unit tier (pytest -m unit -n 2): {unit['tests']} tests in {unit['wall_s']:.1f} s")
    result = {"date": date.today().isoformat(), "command": "python -m bench.kit", "machine": machine(),
              "tests": len(times), "tests_s": round(sum(times.values()), 3), "pytest_wall_s": round(wall, 2),
              "unit_tier": unit,
              "by_file_s": {name: round(seconds, 3) for name, seconds in by_file.items()},
              "by_test_ms": {name: round(seconds * 1000) for name, seconds in times.items()}}
    record(args.out, "kit", result)
    return result


def unit_tier() -> dict[str, Any]:
    """The unit tier as scripts/test runs it (two workers): its tests and its wall clock."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "unit", "-n", "2", f"--junitxml={report}"],
                       cwd=REPO, check=True, capture_output=True)
        wall = time.perf_counter() - started
        tests = sum(1 for _ in ET.parse(report).getroot().iter("testcase"))
    return {"tests": tests, "wall_s": round(wall, 1)}


if __name__ == "__main__":
    main()
