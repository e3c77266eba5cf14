"""A command's page faults per second and its CPU time in user and kernel mode, every few seconds.

Shows whether a fit spends its time faulting memory in (vit/system/malloc.py), stage by stage:
    python scripts/page_faults.py --every 10 -- vit-train -c experiments/cpu60.yaml
Linux only (reads /proc/PID/stat); the command's own output goes to --log.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def read_stat(pid: int) -> tuple[int, float, float]:
    """(minor faults, user seconds, kernel seconds) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), int(fields[11]) / tick, int(fields[12]) / tick


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=10.0, help="seconds between lines")
    p.add_argument("--log", type=Path, default=Path(os.devnull), help="the command's output")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        p.error("give the command after --, e.g. -- vit-train -c experiments/cpu60.yaml")
    if not Path("/proc/self/stat").exists():
        p.error("this reads /proc/PID/stat, which only Linux has")
    with ns.log.open("w") as log:
        try:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        except OSError as err:  # no such program, or not executable
            p.error(f"cannot run {command[0]!r}: {err.strerror}; give a program on PATH after --")
        start = last = time.monotonic()
        before = read_stat(child.pid)
        print("seconds  faults/s  user cores  kernel cores", flush=True)
        while child.poll() is None:
            time.sleep(ns.every)
            try:
                now, stat = time.monotonic(), read_stat(child.pid)
            except (FileNotFoundError, ProcessLookupError):  # it ended while we slept
                break
            span = now - last
            faults, user, kernel = (b - a for a, b in zip(before, stat, strict=True))
            print(f"{now - start:7.0f}  {faults / span:8.0f}  {user / span:10.2f}  "
                  f"{kernel / span:12.2f}", flush=True)  # fmt: skip
            before, last = stat, now
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
