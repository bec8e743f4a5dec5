"""Per-file durations of a test run, slowest first.

    python tools/test_durations.py RUN_DIR [--top 15] [--junit-root workers/learner]

Reads what `./launch.sh test` leaves in RUN_DIR: `*.jsonl` written by node's `test/reporters/file-durations.mjs`
(a line per file, its process from start to exit; the last line of a file counts) and `*.xml` written by pytest's `--junitxml` (a file's seconds
are the sum of its tests' setup, call and teardown; collection is not in them). Writes `RUN_DIR/durations.tsv`
(file, tests, failed, seconds) and prints the `--top` slowest files. Exits 2 when RUN_DIR holds neither.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple


class FileDuration(NamedTuple):
    file: str
    tests: int
    failed: int
    seconds: float


def node_files(path: Path) -> list[FileDuration]:
    # A file's results can reach the reporter after its exit; it then writes the file's line again, counts updated.
    out: dict[str, FileDuration] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            out[str(r["file"])] = FileDuration(str(r["file"]), int(r["tests"]), int(r["failed"]), float(r["seconds"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{n}: not a file-durations line ({err}): {line[:200]}") from err
    return list(out.values())


def pytest_files(path: Path, root: str) -> list[FileDuration]:
    try:
        tree = ET.parse(path)
    except ET.ParseError as err:
        raise ValueError(f"{path}: not a JUnit XML file ({err})") from err
    files: dict[str, list[float]] = {}
    for case in tree.iter("testcase"):
        # xunit1 (`-o junit_family=xunit1`) names the file; xunit2 only the dotted module (and class).
        name = case.get("file") or case.get("classname", "?").replace(".", "/") + ".py"
        tally = files.setdefault(f"{root}/{name}" if root else name, [0, 0, 0.0])
        tally[0] += 1
        tally[1] += 1 if case.find("failure") is not None or case.find("error") is not None else 0
        tally[2] += float(case.get("time", "0"))
    return [FileDuration(f, int(t), int(x), round(s, 3)) for f, (t, x, s) in files.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--junit-root", default="workers/learner", help="the folder pytest ran in, prefixed to its files")
    args = p.parse_args(argv)
    if args.top < 0:
        p.error(f"--top must be 0 or more, not {args.top}")
    if not args.run_dir.is_dir():
        print(f"test_durations: {args.run_dir} is not a folder", file=sys.stderr)
        return 2
    rows: list[FileDuration] = []
    try:
        for f in sorted(args.run_dir.glob("*.jsonl")):
            rows += node_files(f)
        for f in sorted(args.run_dir.glob("*.xml")):
            rows += pytest_files(f, args.junit_root)
    except ValueError as err:
        print(f"test_durations: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"test_durations: no *.jsonl (node) or *.xml (pytest) durations in {args.run_dir}", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: (-r.seconds, r.file))
    table = args.run_dir / "durations.tsv"
    lines = ["file\ttests\tfailed\tseconds"] + [f"{r.file}\t{r.tests}\t{r.failed}\t{r.seconds:.2f}" for r in rows]
    table.write_text("\n".join(lines) + "\n")
    total = sum(r.seconds for r in rows)
    print(f"slowest {min(args.top, len(rows))} of {len(rows)} test files ({total:.0f} s in all; every file: {table}):")
    width = max(len(r.file) for r in rows[: args.top]) if args.top else 0
    for r in rows[: args.top]:
        verdict = f"{r.failed} failed" if r.failed else "ok"
        print(f"  {r.seconds:8.1f} s  {r.file:<{width}}  {r.tests:4d} tests  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
