#!/usr/bin/env python
"""Where the test suite's time goes: seconds per test file from a pytest JUnit XML report,
and, with a job log, the MPI jobs each file started.

    bash scripts/run_tests.sh --junitxml=/tmp/suite.xml     # HVDLIKE_TEST_JOB_LOG=/tmp/jobs
    python scripts/suite_times.py /tmp/suite.xml [--jobs /tmp/jobs] [--top 30]

The job log is what tests/mpi_harness.py writes with HVDLIKE_TEST_JOB_LOG set: one line per
job it started (hvdlikerun, mpirun, srun), with its test and seconds. Prints a Markdown table,
slowest file first.
"""
import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional


def per_file(xml_path: str) -> Dict[str, Dict[str, float]]:
    files: Dict[str, Dict[str, float]] = collections.defaultdict(
        lambda: {"seconds": 0.0, "tests": 0, "skipped": 0})
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("classname", "").replace(".", "/") + ".py"
        row = files[name]
        row["seconds"] += float(case.get("time", 0))
        row["tests"] += 1
        row["skipped"] += case.find("skipped") is not None
    return files


def jobs_per_file(log_path: str) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = collections.defaultdict(list)
    with open(log_path) as f:
        for line in f:
            job = json.loads(line)
            out[job["test"].split("::")[0]].append(job["seconds"])
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("xml")
    p.add_argument("--jobs", help="the job log (HVDLIKE_TEST_JOB_LOG)")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    files = per_file(args.xml)
    jobs = jobs_per_file(args.jobs) if args.jobs else {}
    total = sum(r["seconds"] for r in files.values())
    print("| file | seconds | share | tests (skipped) |" + (" MPI jobs | job seconds |"
                                                             if jobs else ""))
    print("|---|---|---|---|" + ("---|---|" if jobs else ""))
    ranked = sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
    for name, r in ranked[:args.top]:
        line = (f"| {name} | {r['seconds']:.0f} | {r['seconds'] / total:.1%} | "
                f"{r['tests']:.0f} ({r['skipped']:.0f}) |")
        if jobs:
            times = jobs.get(name, [])
            line += f" {len(times)} | {sum(times):.0f} |"
        print(line)
    print(f"| all {len(files)} files | {total:.0f} | 100% | "
          f"{sum(r['tests'] for r in files.values()):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
