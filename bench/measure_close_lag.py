#!/usr/bin/env python3
"""Measures expire_at -> CLOSED -> released on a running local stack.

Creates N unpaid orders (default 40) spread over a few seconds, waits until
all of them are CLOSED and their reservations RELEASED, and prints
P50/P95/P99/max of the time from each order's expire_at to its CLOSED entry
in the order's own history, and from CLOSED to the reservation's release
(`updated_at`), all written by the server. Run after `DEMO=0 infra/local.sh up`:

    .venv/bin/python bench/measure_close_lag.py [--orders N]

Reads .local/stack.env (API_BASE_URL, TABLE_NAME, AWS_*). Seeds its own SKU
directly in the table, so it works with any version of the admin API.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
import uuid
from datetime import datetime

import boto3
import boto3.dynamodb.conditions

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "infra"))
from buyers import Buyers  # noqa: E402


def load_env(path: str) -> None:
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            os.environ.setdefault(k, v)


def ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(p / 100 * len(v) + 0.5) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=40)
    ap.add_argument("--env", default=os.path.join(os.path.dirname(__file__), "..", ".local", "stack.env"))
    args = ap.parse_args()
    load_env(args.env)
    base = os.environ["API_BASE_URL"].rstrip("/")
    table = boto3.resource("dynamodb").Table(os.environ["TABLE_NAME"])
    sku = f"lag-{uuid.uuid4().hex[:8]}"
    table.put_item(Item={"pk": f"SKU#{sku}", "sk": "STOCK", "entity": "STOCK", "sku": sku,
                         "available": args.orders, "reserved": 0, "sold": 0, "price": 100, "currency": "EUR"})
    token = Buyers().sign_in("lag-user")[0]
    ids = []
    for i in range(args.orders):
        body = json.dumps({"currency": "EUR",
                           "items": [{"sku": sku, "qty": 1, "unit_price": 100}]}).encode()
        req = urllib.request.Request(f"{base}/orders", data=body, method="POST",
                                     headers={"content-type": "application/json",
                                              "Authorization": f"Bearer {token}",
                                              "Idempotency-Key": uuid.uuid4().hex})
        with urllib.request.urlopen(req) as r:
            ids.append(json.load(r)["order_id"])
        time.sleep(0.1)
        print(f"\rcreated {i + 1}/{args.orders}", end="", flush=True)
    print()
    lags: dict[str, float] = {}
    released: dict[str, float] = {}
    deadline = time.time() + 600
    while len(released) < len(ids) and time.time() < deadline:
        for oid in ids:
            if oid in released:
                continue
            items = table.query(KeyConditionExpression=boto3.dynamodb.conditions.Key("pk").eq(f"ORDER#{oid}"),
                                ConsistentRead=True)["Items"]
            order = next(i for i in items if i["sk"] == "ORDER")
            closed = [h for h in order.get("history", []) if h.get("to") == "CLOSED"]
            if closed and oid not in lags:
                lags[oid] = ts(closed[0]["at"]) - ts(order["expire_at"])
            res = next((i for i in items if i["sk"].startswith("RES#STOCK#")), None)
            if closed and res and res.get("status") == "RELEASED":
                released[oid] = ts(res["updated_at"]) - ts(closed[0]["at"])
        print(f"\rclosed {len(lags)}/{len(ids)}, released {len(released)}/{len(ids)}", end="", flush=True)
        time.sleep(1)
    print()
    if len(released) < len(ids):
        print(f"only {len(released)} of {len(ids)} released within 10 minutes", file=sys.stderr)
        return 1
    for label, v in (("expire_at -> CLOSED", list(lags.values())), ("CLOSED -> released", list(released.values()))):
        print(f"{label} over {len(v)} orders: P50 {pct(v, 50):.2f} s, P95 {pct(v, 95):.2f} s, "
              f"P99 {pct(v, 99):.2f} s, max {max(v):.2f} s, min {min(v):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
