#!/usr/bin/env python3
"""How long the write-ahead log's sync takes beside a checkpoint, on this disk.

    python3 tests/bench/log_sync.py DIR append|overwrite [SECONDS]

A stand-in for the embedded store's two writers, with no server: one thread
writes 1,000 scattered 4 KiB pages into DIR/big (half of them growing the
file) and `fdatasync`s them every 200 ms, as a checkpoint does; the main
thread appends 90 kB records to DIR/wal.MODE with an `fdatasync` after
each, as the log does for a batch. `append` grows the log file as the
store's log does (emptied once it holds 60 MiB, as a new segment starts
empty); `overwrite` writes over and over into a 64 MiB file written and
synced first (no new blocks, no size change, so a sync needs no journal
commit).
Prints the syncs done and their p50, p90, p99 and max. Used in the
fifty-ninth session (docs/benchmarks-history.md) to ask whether a
preallocated log would wait less behind a checkpoint: it did not.
"""
import os
import random
import sys
import threading
import time


def main():
    d, mode = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 8
    if mode not in ("append", "overwrite"):
        sys.exit("MODE is append or overwrite")
    os.makedirs(d, exist_ok=True)
    stop = threading.Event()

    def checkpointer():
        fd = os.open(os.path.join(d, "big"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        end, page = 0, os.urandom(4096)
        while not stop.is_set():
            for _ in range(1000):
                if random.random() < 0.5:
                    at, end = end, end + 4096
                else:
                    at = random.randrange(0, max(end, 4096) // 4096) * 4096
                os.pwrite(fd, page, at)
            os.fdatasync(fd)
            time.sleep(0.2)
        os.close(fd)

    fd = os.open(os.path.join(d, "wal." + mode), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    if mode == "overwrite":
        os.write(fd, b"\0" * (64 << 20))
        os.fsync(fd)
    t = threading.Thread(target=checkpointer)
    t.start()
    record, at, took = os.urandom(90_000), 0, []
    end = time.time() + seconds
    while time.time() < end:
        start = time.perf_counter()
        os.pwrite(fd, record, at)
        at += len(record)
        if at + len(record) > (60 << 20):
            # `append`: a new segment, as the store's log starts one per
            # checkpoint (the file emptied, so appends grow it again);
            # `overwrite`: back to the start of the preallocated file.
            if mode == "append":
                os.ftruncate(fd, 0)
            at = 0
        os.fdatasync(fd)
        took.append((time.perf_counter() - start) * 1000)
    stop.set()
    t.join()
    took.sort()
    q = lambda p: took[int(p * (len(took) - 1))]
    print(f"{mode}: {len(took)} syncs; p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f} max {took[-1]:.2f} ms")


if __name__ == "__main__":
    main()
