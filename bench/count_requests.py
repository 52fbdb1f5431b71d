#!/usr/bin/env python3
"""AWS requests, Lambda invocations and billed time per order, from the functions' logs.

Needs a stack started with `COUNT_AWS_CALLS=1 infra/local.sh up`: every
function then logs one `aws_call` line per request attempt it sends to AWS
(`shared/src/aws/call_count.rs`: service, operation, function). Lambda's own
START / REPORT lines give the invocations and their billed durations. This
reads every function's log group (CloudWatch Logs, the emulator's or AWS's)
for a time window and prints, per function: invocations, mean billed
duration, memory, GB-seconds and requests by operation; then the totals
divided by `--orders`.

The window should hold one run of one path (loadcheck `--only`, or
`--unpaid-only`, or the late-payment drill at `--drill-share 1`) and nothing
else. Functions that run on a clock, not per order (the sweep every minute,
the daily reconcile, the sandbox channel's settle route, which stands in for
a provider), are printed apart and left out of the per-order figures;
`--include` puts one back.

    set -a; . .local/stack.env; set +a
    .venv/bin/python bench/count_requests.py --since 2026-12-03T18:20:00Z --until 2026-12-03T18:25:00Z --orders 200
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import sys

import boto3

REPORT = re.compile(r"Billed Duration: (\d+) ms\s+Memory Size: (\d+) MB")
# Not per order: they run on a schedule, or stand in for the provider.
APART = {"sweep", "reconcile", "sandbox-channel"}


def millis(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1000)


def events(logs, group: str, start: int, end: int):
    kwargs = {"logGroupName": group, "startTime": start, "endTime": end}
    while True:
        page = logs.filter_log_events(**kwargs)
        yield from page.get("events", [])
        token = page.get("nextToken")
        if not token or not page.get("events"):
            return
        kwargs["nextToken"] = token


READS = {"GetItem", "BatchGetItem", "Query", "Scan", "ReceiveMessage", "GetSchedule", "GetParameter"}
# The API functions a client calls: an invocation of theirs that only read
# is a client looking (loadcheck polls an order until it is final), which a
# client may or may not do, so it is counted apart from the path's cost.
API_FUNCTIONS = {"order-api", "create-order"}
# Operator calls the run makes before its orders (loadcheck seeds its SKUs).
SETUP_MESSAGES = {"stock changed"}


class Invocation:
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.messages: set[str] = set()
        self.billed_ms = 0
        self.memory_mb = 0
        # What the function logs (its own lines and Lambda's START/END/
        # REPORT), without the aws_call lines this measurement adds.
        self.log_bytes = 0


class Function:
    """One function's invocations in the window, split into the path's own,
    the client's reads and the run's setup."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.by_request: dict[str, Invocation] = collections.defaultdict(Invocation)

    def read(self, message: str) -> None:
        if message.startswith(("START RequestId", "END RequestId", "REPORT RequestId")):
            request = message.split()[2]
            inv = self.by_request[request]
            inv.log_bytes += len(message.encode()) + 1
        if message.startswith("REPORT RequestId"):
            m = REPORT.search(message)
            inv.messages.add("REPORT")
            if m:
                inv.billed_ms, inv.memory_mb = int(m.group(1)), int(m.group(2))
            return
        if not message.startswith("{"):
            return
        try:
            line = json.loads(message)
        except ValueError:
            return
        spans = line.get("spans") or [{}]
        request = spans[0].get("requestId") or "?"
        inv = self.by_request[request]
        if line.get("message") == "aws_call":
            inv.calls[f'{line.get("service", "?")}.{line.get("operation", "?")}'] += 1
            return
        inv.log_bytes += len(message.encode()) + 1
        if isinstance(line.get("message"), str):
            inv.messages.add(line["message"])

    def kind(self, inv: Invocation) -> str:
        if inv.messages & SETUP_MESSAGES:
            return "setup"
        if self.name in API_FUNCTIONS and all(op.split(".")[1] in READS for op in inv.calls):
            return "client reads"
        return "path"

    def part(self, kind: str) -> "Part":
        part = Part()
        for inv in self.by_request.values():
            if "REPORT" in inv.messages and self.kind(inv) == kind:
                part.invocations += 1
                part.billed_ms += inv.billed_ms
                part.memory_mb = inv.memory_mb or part.memory_mb
                part.calls.update(inv.calls)
                part.log_bytes += inv.log_bytes
        return part


class Part:
    def __init__(self) -> None:
        self.invocations = 0
        self.billed_ms = 0
        self.memory_mb = 0
        self.log_bytes = 0
        self.calls: collections.Counter[str] = collections.Counter()

    @property
    def gb_seconds(self) -> float:
        return self.billed_ms / 1000 * self.memory_mb / 1024


def read_all(stack: str, start: int, end: int) -> dict[str, Function]:
    logs = boto3.client("logs")
    prefix = f"/aws/lambda/{stack}-"
    groups = []
    for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
        groups += [g["logGroupName"] for g in page["logGroups"]]
    if not groups:
        sys.exit(f"no log group starts with {prefix}: is the stack up and STACK_NAME right?")
    functions = {}
    for group in sorted(groups):
        f = Function(group[len(prefix):])
        for e in events(logs, group, start, end):
            f.read(e["message"])
        functions[group[len(prefix):]] = f
    return functions


def print_part(name: str, f: Part, orders: int) -> None:
    mean = f.billed_ms / f.invocations if f.invocations else 0
    print(f"{name:<24} {f.invocations:>7} inv ({f.invocations / orders:5.2f}/order)  "
          f"mean {mean:6.0f} ms  {f.memory_mb:>5} MB  {f.gb_seconds:9.3f} GB-s  "
          f"{sum(f.calls.values()):>7} requests ({sum(f.calls.values()) / orders:5.2f}/order)  "
          f"log {f.log_bytes / orders:6.0f} B/order")
    for op, n in sorted(f.calls.items()):
        print(f"{'':<26}{op:<34} {n:>7}  {n / orders:6.2f}/order")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--since", required=True, help="window start, RFC 3339 (UTC)")
    ap.add_argument("--until", required=True, help="window end, RFC 3339 (UTC)")
    ap.add_argument("--orders", type=int, required=True, help="orders the window's run made")
    ap.add_argument("--stack", default=os.environ.get("STACK_NAME", "order-expiry"))
    ap.add_argument("--include", action="append", default=[], help="count this scheduled function per order too")
    ap.add_argument("--json", action="store_true", help="print the per-order figures as one JSON object instead")
    a = ap.parse_args()
    functions = read_all(a.stack, millis(a.since), millis(a.until))
    if not any(inv.calls for f in functions.values() for inv in f.by_request.values()):
        print("warning: no aws_call line in the window: was the stack started with COUNT_AWS_CALLS=1?",
              file=sys.stderr)
    parts = {}
    for name, f in functions.items():
        for kind in ("path", "client reads", "setup"):
            part = f.part(kind)
            if part.invocations:
                where = "apart" if kind != "path" or (name in APART and name not in a.include) else "path"
                label = name if kind == "path" else f"{name} ({kind})"
                parts[label] = (where, part)
    path = {n: p for n, (w, p) in parts.items() if w == "path"}
    invocations = sum(p.invocations for p in path.values())
    requests: collections.Counter[str] = collections.Counter()
    for p in path.values():
        for op, n in p.calls.items():
            requests[op.split(".")[0]] += n
    gb_s = sum(p.gb_seconds for p in path.values())
    log_bytes = sum(p.log_bytes for p in path.values())
    if a.json:
        print(json.dumps({
            "orders": a.orders,
            "invocations_per_order": invocations / a.orders,
            "requests_per_order": {k: v / a.orders for k, v in sorted(requests.items())},
            "gb_seconds_per_order": gb_s / a.orders,
            "log_bytes_per_order": log_bytes / a.orders,
            "functions": {n: {"invocations": p.invocations, "billed_ms": p.billed_ms, "memory_mb": p.memory_mb,
                              "calls": dict(p.calls)} for n, p in path.items()},
        }, indent=2))
        return
    print(f"window {a.since} .. {a.until}, {a.orders} orders")
    for name, p in sorted(path.items()):
        print_part(name, p, a.orders)
    print(f"per order: {invocations / a.orders:.2f} invocations, "
          + ", ".join(f"{svc} {n / a.orders:.2f}" for svc, n in sorted(requests.items()))
          + f" requests ({sum(requests.values()) / a.orders:.2f} in all), {gb_s / a.orders * 1000:.1f} GB-ms, "
          f"{log_bytes / a.orders:.0f} log bytes")
    apart = {n: p for n, (w, p) in parts.items() if w == "apart"}
    if apart:
        print("not counted per order (scheduled, the provider's stand-in, the client's reads, the run's setup):")
        for name, p in sorted(apart.items()):
            print_part(name, p, a.orders)


if __name__ == "__main__":
    main()
