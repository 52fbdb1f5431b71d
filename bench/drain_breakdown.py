#!/usr/bin/env python3
"""Where the drain's time goes on the local stack, from the emulator's log.

ministack (1.5.33) polls every event source mapping from one loop: the
DynamoDB stream's batches run in that loop, the SQS mappings' batches are
handed to background threads (up to 5 in flight per mapping). It logs each
batch it hands to a function ("ESM: Lambda <fn> processed <n> ...") with a
timestamp to the second, and the functions' own JSON lines follow, so they
are attributed to that time. For a time window this prints, per mapping:
batches, records, records per batch, and the window's wall time charged to
it by batch lines (the time from one batch line to the next goes to the
later one: a rough split of the emulator's attention, not busy time, since
SQS batches overlap); plus the close-order outcomes and triggers seen.
"""
from __future__ import annotations

import argparse
import collections
import json
import re

LINE = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d) INFO \[(\w+)\] (.*)$")
BATCH = re.compile(r"ESM: Lambda (\S+) processed (\d+) (SQS messages|DynamoDB stream records)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", required=True, help="HH:MM:SS (UTC, as in the log)")
    ap.add_argument("--until", required=True, help="HH:MM:SS")
    ap.add_argument("--log", default=".local/ministack.log")
    a = ap.parse_args()

    def secs(hms: str) -> int:
        h, m, s = (int(x) for x in hms.split(":"))
        return h * 3600 + m * 60 + s

    lo, hi = secs(a.since), secs(a.until)
    batches = collections.Counter()
    records = collections.Counter()
    busy = collections.Counter()
    outcomes = collections.Counter()
    deliveries = collections.Counter()
    now = None
    last_batch_at = None
    for raw in open(a.log, encoding="utf-8", errors="replace"):
        m = LINE.match(raw)
        if m:
            now = secs(m.group(2))
            if not lo <= now <= hi:
                continue
            b = BATCH.search(m.group(4))
            if b:
                fn = b.group(1)
                batches[fn] += 1
                records[fn] += int(b.group(2))
                busy[fn] += (now - last_batch_at) if last_batch_at is not None else 0
                last_batch_at = now
            elif m.group(3) == "events" and "→ SQS" in m.group(4):
                deliveries[m.group(4).split("→ SQS ")[1].rsplit("-", 1)[0]] += 1
            continue
        if now is None or not lo <= now <= hi or not raw.startswith("{"):
            continue
        try:
            fields = json.loads(raw).get("fields", {})
        except ValueError:
            continue
        if fields.get("message") == "close reminder handled":
            outcome = str(fields.get("outcome", "?")).split(" ")[0]
            outcomes[(fields.get("trigger", "?"), outcome)] += 1

    window = max(hi - lo, 1)
    print(f"window {a.since}..{a.until} ({window} s); batches per mapping:")
    print(f"  {'function':<30} {'batches':>8} {'records':>8} {'per batch':>9} {'time by lines':>14}")
    for fn in sorted(batches, key=lambda f: -busy[f]):
        print(
            f"  {fn:<30} {batches[fn]:>8} {records[fn]:>8} {records[fn] / batches[fn]:>9.1f}"
            f" {busy[fn]:>6} s {100 * busy[fn] / window:>3.0f}%"
        )
    idle = window - sum(busy.values())
    print(f"  {'(before the first batch line, or idle)':<58} {idle:>6} s {100 * idle / window:>3.0f}%")
    print("EventBridge deliveries to queues:", dict(deliveries))
    print("close-order outcomes by trigger:")
    for (trigger, outcome), n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {trigger:<10} {outcome:<20} {n}")


if __name__ == "__main__":
    main()
