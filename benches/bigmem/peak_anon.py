#!/usr/bin/env python3
"""Runs a command and prints the highest anonymous, file-backed and shared resident memory of
its process, sampled from /proc/PID/status every 20 ms, and its VmHWM (Linux):

    python3 benches/bigmem/peak_anon.py target/release/moestream generate --model DIR ...

The command's own output follows (its stderr too when it fails)."""

import subprocess
import sys
import time

KEYS = ["RssAnon", "RssFile", "RssShmem", "VmHWM"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = dict.fromkeys(KEYS, 0)
    while p.poll() is None:
        try:
            status = open(f"/proc/{p.pid}/status").read()
        except OSError:
            break
        for line in status.splitlines():
            key = line.split(":")[0]
            if key in peak:
                peak[key] = max(peak[key], int(line.split()[1]))
        time.sleep(0.02)
    out, err = p.communicate()
    print(f"exit {p.returncode}; peak MiB: " + " ".join(f"{k} {v / 1024:.0f}" for k, v in peak.items()))
    print(out, end="")
    if p.returncode:
        print(err, end="", file=sys.stderr)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
