#!/usr/bin/env python3
"""Where the applier's time goes, per table, from a server log.

    python3 tests/bench/applier_costs.py SERVER_LOG [SKIP_SECONDS]

The server must log the store at debug level (`MARKETPLACE_LOG=info,
marketplace::store=debug`; in the external bench `BENCH_LOG=info,
marketplace::store=debug BENCH_KEEP=1`, which keeps the paid run's
`server.log`). Each "batches applied" line names the requests it holds
(`members`), the rows each table took with the microseconds it took to
write them (`tables="kv:timeline 420/3100 cash:outputs 60/700 ..."`) and
redb's commit (`commit_us`). This sums them (after SKIP_SECONDS of the log,
default 0, to leave out a warm-up) and prints, per table, its rows, the
microseconds a row took and what it comes to per request; then the commit
per request and the total. These are the applier thread's wall-clock
times: on a busy machine they include time the thread waited for a core.
"""

import datetime
import re
import sys
from collections import defaultdict

LINE = re.compile(
    r"^(\S+) DEBUG .*batches applied took_us=(\d+) batches=(\d+) members=(\d+)"
    r" commit_us=(\d+) tables=(.*)$"
)


def main():
    path = sys.argv[1]
    skip = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    rows = defaultdict(int)
    micros = defaultdict(int)
    members = applies = commit = took = 0
    start = None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        at = datetime.datetime.fromisoformat(m[1].rstrip("Z")).timestamp()
        start = at if start is None else start
        if at - start < skip:
            continue
        applies += 1
        took += int(m[2])
        members += int(m[4])
        commit += int(m[5])
        for table, n, us in re.findall(r"(\S+) (\d+)/(\d+)", m[6].strip('"')):
            rows[table] += int(n)
            micros[table] += int(us)
    if not members:
        sys.exit("no `batches applied` lines with members: is the store logged at debug level?")
    print(f"{applies} applies, {members} requests ({members / applies:.1f} an apply)")
    print(f"{'table':<28} {'rows':>10} {'rows/req':>9} {'µs/row':>8} {'µs/req':>8}")
    for table in sorted(rows, key=lambda t: -micros[t]):
        n, us = rows[table], micros[table]
        print(f"{table:<28} {n:>10} {n / members:>9.2f} {us / max(n, 1):>8.2f} {us / members:>8.2f}")
    print(f"{'commit':<28} {'':>10} {'':>9} {'':>8} {commit / members:>8.2f}")
    print(f"{'whole apply':<28} {'':>10} {'':>9} {'':>8} {took / members:>8.2f}")


if __name__ == "__main__":
    main()
