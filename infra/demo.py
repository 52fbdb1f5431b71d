#!/usr/bin/env python3
"""The local demo: seed stock and a coupon, create a few orders through the
HTTP API, pay one of them through Stripe (localstripe, playing the part
Stripe.js plays in a shop's checkout), leave the others unpaid, and watch
the paid one stay PAID with its stock sold while the others close at their
expiry with the stock and the coupon returned. Reads .local/stack.env from
the environment.

Admin routes are AWS_IAM-authorised, so those calls are SigV4-signed (the
emulator accepts any credentials, but like AWS it rejects unsigned calls).
Buyer routes take a buyer's access token: the demo's buyers are users of the
stack's Cognito pool (infra/buyers.py), and their orders are theirs.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone

import botocore.auth
import botocore.awsrequest
import botocore.credentials

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from buyers import Buyers  # noqa: E402

BASE = os.environ["API_BASE_URL"].rstrip("/")
REGION = os.environ.get("AWS_REGION", "us-east-1")
CREDS = botocore.credentials.Credentials(
    os.environ.get("AWS_ACCESS_KEY_ID", "test"), os.environ.get("AWS_SECRET_ACCESS_KEY", "test")
)
TTY = sys.stdout.isatty()
CYAN, RESET = ("\033[1;36m", "\033[0m") if TTY else ("", "")


def say(msg):
    print(f"{CYAN}[demo]{RESET} {msg}", flush=True)


BUYERS = None
OWNERS = {}  # order id -> buyer name


def call(method, path, body=None, headers=None, signed=False, buyer=None):
    url = BASE + path
    data = json.dumps(body).encode() if body is not None else None
    hs = {"content-type": "application/json", **(headers or {})}
    if buyer:
        hs["Authorization"] = "Bearer " + BUYERS.sign_in(buyer)[0]
    if signed:
        req = botocore.awsrequest.AWSRequest(method=method, url=url, data=data, headers=hs)
        botocore.auth.SigV4Auth(CREDS, "execute-api", REGION).add_auth(req)
        hs = dict(req.headers.items())
    req = urllib.request.Request(url, data=data, method=method, headers=hs)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def must(status_body, want):
    status, body = status_body
    if status != want:
        sys.exit(f"[demo] unexpected HTTP {status}: {json.dumps(body)}")
    return body


def stripe(method, path, form=None):
    """A call to the Stripe API (localstripe here) with the stack's test key."""
    import base64
    import urllib.parse
    base = os.environ["STRIPE_API_BASE_URL"].rstrip("/")
    key = base64.b64encode((os.environ["STRIPE_SECRET_KEY"] + ":").encode()).decode()
    data = urllib.parse.urlencode(form or {}).encode() if method == "POST" else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Authorization": "Basic " + key})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def pay_with_card(intent_id, card="4242424242424242"):
    """What the buyer's browser does with Stripe.js and the client_secret:
    a card payment method on the intent, then the confirmation."""
    pm = stripe("POST", "/v1/payment_methods", {"type": "card", "card[number]": card, "card[exp_month]": "12",
                                                "card[exp_year]": "2034", "card[cvc]": "123"})
    stripe("POST", f"/v1/payment_intents/{intent_id}", {"payment_method": pm["id"]})
    return stripe("POST", f"/v1/payment_intents/{intent_id}/confirm")


def parse(ts):
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def seed(run):
    """Stock for five units of one SKU and a coupon for alice."""
    sku, coupon = f"DEMO-MUG-{run}", f"DEMO-WELCOME-{run}"
    stock = must(call("PUT", f"/admin/skus/{sku}", {"available": 5, "price": 1299, "currency": "EUR"}, signed=True), 200)
    say(f"seeded stock {sku}: {stock}")
    alice_id = BUYERS.sign_in("alice")[1]
    must(call("PUT", f"/admin/coupons/{coupon}", {"user_id": alice_id, "valid_until": "2099-01-01T00:00:00Z"}, signed=True), 200)
    say(f"seeded coupon {coupon} for alice")
    return sku, coupon


def create_orders(run, sku, coupon):
    """Three orders taking all five units; a sixth unit is refused."""
    orders = []
    for user, qty, cpn in [("alice", 2, coupon), ("bob", 1, None), ("carol", 2, None)]:
        body = {"currency": "EUR", "items": [{"sku": sku, "qty": qty, "unit_price": 1299}]}
        if cpn:
            body["coupon_id"] = cpn
        o = must(call("POST", "/orders", body, {"Idempotency-Key": f"demo-{run}-{user}"}, buyer=user), 201)
        orders.append(o)
        OWNERS[o["order_id"]] = user
        say(f"created {o['order_id']} for {user}: {qty} x {sku}, {o['amount_total']} {o['currency']}, expires {o['expire_at']}")
    over = call("POST", "/orders", {"currency": "EUR", "items": [{"sku": sku, "qty": 1, "unit_price": 1299}]},
                {"Idempotency-Key": f"demo-{run}-dave"}, buyer="dave")
    say(f"a sixth unit is refused: HTTP {over[0]} {over[1]['error']['code']}")
    say(f"stock now {must(call('GET', f'/admin/skus/{sku}', signed=True), 200)}; coupon "
        f"{must(call('GET', f'/admin/coupons/{coupon}', signed=True), 200)['state']}")
    return orders


def pay_through_stripe(run, paid):
    """bob pays by card at localstripe; the webhook makes the order PAID."""
    attempt = must(call("POST", f"/orders/{paid['order_id']}/payments", {"channel": "stripe"},
                        {"Idempotency-Key": f"demo-{run}-pay"}, buyer="bob"), 201)
    intent_id = attempt["client_secret"].split("_secret_")[0]
    say(f"bob pays {paid['order_id']} through Stripe: payment {attempt['payment_id']}, PaymentIntent {intent_id} "
        f"(the API hands his client the client_secret and {attempt.get('publishable_key')})")
    confirmed = pay_with_card(intent_id)
    say(f"card 4242 4242 4242 4242 confirmed at Stripe: intent {confirmed['status']}")
    deadline = time.time() + 60
    while time.time() < deadline:
        view = must(call("GET", f"/orders/{paid['order_id']}", buyer="bob"), 200)
        if view["status"] == "PAID":
            break
        time.sleep(1)
    else:
        sys.exit(f"[demo] {paid['order_id']} is not PAID after the Stripe webhook (see infra/local.sh logs)")
    say(f"{paid['order_id']} PAID (Stripe's payment_intent.succeeded webhook, checked against the intent)")


def wait_for_closes(orders, paid, deadline):
    """Each unpaid order CLOSED, with its lag after expire_at."""
    pending = {o["order_id"] for o in orders if o is not paid}
    while pending and time.time() < deadline:
        for oid in sorted(pending):
            view = must(call("GET", f"/orders/{oid}", buyer=OWNERS[oid]), 200)
            if view["status"] == "CLOSED":
                pending.discard(oid)
                hist = must(call("GET", f"/admin/orders/{oid}", signed=True), 200)["history"]
                closed_at = next(h["at"] for h in hist if h["to"] == "CLOSED")
                lag = (parse(closed_at) - parse(view["expire_at"])).total_seconds()
                say(f"{oid} CLOSED at {closed_at} ({lag:.1f}s after expire_at)")
        if pending:
            time.sleep(2)
    if pending:
        sys.exit(f"[demo] not closed in time: {sorted(pending)} (see infra/local.sh logs)")


def wait_for_release(sku, coupon, deadline):
    """The closed orders' units and the coupon back; bob's unit sold."""
    while time.time() < deadline:
        s = must(call("GET", f"/admin/skus/{sku}", signed=True), 200)
        c = must(call("GET", f"/admin/coupons/{coupon}", signed=True), 200)
        if s["available"] == 4 and s["reserved"] == 0 and c["state"] == "AVAILABLE":
            break
        time.sleep(1)
    else:
        sys.exit("[demo] stock or coupon not released in time")
    say(f"stock: the closed orders' units back, bob's sold: {s}; coupon {coupon}: {c['state']} ({c.get('reason', '')})")


def show_orders_and_next_steps(orders, sku):
    for o in orders:
        v = must(call("GET", f"/orders/{o['order_id']}", buyer=OWNERS[o["order_id"]]), 200)
        items = ", ".join(f"{i['sku']} x{i['qty']} {i['reservation']}" for i in v["items"])
        say(f"{v['order_id']}: {v['status']}; {items}{'; coupon ' + v['coupon']['state'] if 'coupon' in v else ''}")
    say("done. The stack keeps running: try the API yourself, e.g.")
    print("  eval \"$(.venv/bin/python infra/buyers.py alice)\"   # ACCESS_TOKEN and USER_ID of buyer alice")
    print(f"  curl -s -H \"Authorization: Bearer $ACCESS_TOKEN\" {BASE}/orders/{orders[0]['order_id']}")
    print(f"  curl -s -X POST {BASE}/orders -H \"Authorization: Bearer $ACCESS_TOKEN\" -H 'Idempotency-Key: my-key-1' \\")
    print(f"       -H 'content-type: application/json' -d '{{\"currency\":\"EUR\",\"items\":[{{\"sku\":\"{sku}\",\"qty\":1}}]}}'")
    print("  infra/local.sh down    # stop it")


def main():
    global BUYERS
    BUYERS = Buyers()
    run = uuid.uuid4().hex[:6]
    window = os.environ.get("PAYMENT_WINDOW_SECONDS", "?")
    say(f"API base URL {BASE}; payment window {window}s")
    sku, coupon = seed(run)
    orders = create_orders(run, sku, coupon)
    paid = orders[1]
    pay_through_stripe(run, paid)
    say("leaving the other orders unpaid; waiting for their wake-ups ...")
    deadline = time.time() + int(window if window.isdigit() else 30) + 120
    wait_for_closes(orders, paid, deadline)
    wait_for_release(sku, coupon, deadline)
    show_orders_and_next_steps(orders, sku)


if __name__ == "__main__":
    main()
