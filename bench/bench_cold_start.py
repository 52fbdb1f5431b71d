#!/usr/bin/env python3
"""Benchmark 3d (issue 9): cold start, peak RSS and bootstrap size of every
function of the release build, beside a Python boto3 handler creating the
same clients (bench/bench_python_handler.py), in the same run, under the
same fake Lambda Runtime API.

For each function of template.yaml (its Handler) and each side, N times:
  1. start the process with the function's environment from the template
     (dev parameter set, references replaced by local names), _HANDLER,
     AWS_LAMBDA_RUNTIME_API pointing at a fake Runtime API served here,
     dummy credentials, and AWS_ENDPOINT_URL pointing at a fake AWS endpoint
     served here (SSM GetParameter answers a secret, since two functions read
     one at init; every other call gets a 400 ValidationException, quickly
     and without retries);
  2. init = process start -> its first GET /runtime/invocation/next (what
     Lambda reports as Init Duration, plus the exec);
  3. serve one event (the function's fixture from events/), first invoke =
     that GET -> its POST .../response or .../error;
  4. peak RSS = VmHWM of /proc/<pid>/status after that answer; then kill.
Medians over N runs are printed (the first run of each also warms the page
cache; it is counted like the others). Not part of the test command.

Usage: .venv/bin/python bench/bench_cold_start.py [--bootstrap PATH] [--runs N]
       [--only close-order,relay] [--json out.json]
Default bootstrap: target/lambda-x86_64/bootstrap/bootstrap, built by
`infra/release.sh --arch x86_64 --lambda-dir target/lambda-x86_64` (the arm64
one of `infra/release.sh` cannot run on an x86_64 host without qemu).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "infra"))
import template_check  # noqa: E402  (the template as deployed, and the clients each function builds)

# The dev stack has every function (the sandbox too); faults off, no local API id.
PARAMS = {"Stage": "dev", "EnableSandboxChannel": "true", "FaultInjection": "off", "LocalApiId": ""}
REGION = "us-east-1"
ACCOUNT = "000000000000"
# The first event each function is sent: its trigger's fixture.
EVENTS = {
    "create-order": "create-order.json",
    "order-api": "order-api-get-order.json",
    "payment-webhook": "payment-webhook.json",
    "sandbox-channel": "sandbox-channel-settle.json",
    "relay": "relay-order-inserted.json",
    "schedule-wakeup": "schedule-wakeup.json",
    "close-order": "close-order.json",
    "release-order": "release-order.json",
    "settle-order": "settle-order.json",
    "drive-effects": "drive-effects.json",
    "refund-worker": "refund-worker-sqs.json",
    "reconcile": "reconcile.json",
    "sweep": None,  # a scheduled event: {}
}
BOTO3_SERVICE = {"dynamodb": "dynamodb", "sqs": "sqs", "scheduler": "scheduler", "ssm": "ssm", "eventbridge": "events"}


class QuietServer(ThreadingHTTPServer):
    """A killed process resets its connections: that is the benchmark
    working, not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


# ------------------------------------------------------------ fake AWS
class FakeAws(BaseHTTPRequestHandler):
    """Every AWS call of a function lands here: SSM GetParameter gets a
    secret (init needs it), anything else a non-retryable 400."""

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        target = self.headers.get("X-Amz-Target", "")
        if target == "AmazonSSM.GetParameter":
            name = json.loads(body or b"{}").get("Name", "/x")
            param = {"Name": name, "Type": "SecureString", "Value": "bench-secret", "Version": 1,
                     "ARN": f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{name}"}
            return self._send(200, {"Parameter": param})
        self._send(400, {"__type": "com.amazon.coral.validate#ValidationException", "message": "bench: no AWS here"},
                   {"x-amzn-ErrorType": "ValidationException"})

    do_GET = do_PUT = do_DELETE = do_POST

    def _send(self, status: int, doc: dict, headers: dict | None = None):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass


# ---------------------------------------------------- fake Runtime API
class Invocation:
    """One cold start: serves one event, records when init ended and when
    the answer came, then holds the process's next poll until it is killed."""

    def __init__(self, event: bytes):
        self.event = event
        self.first_next: float | None = None
        self.answered: float | None = None
        self.outcome = ""
        self.done = threading.Event()
        self.release = threading.Event()


def runtime_api(inv: Invocation) -> ThreadingHTTPServer:
    class Api(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if not self.path.endswith("/runtime/invocation/next"):
                return self._reply(404, b"{}")
            if inv.first_next is not None:  # the second poll: the function is idle now
                inv.release.wait(60)  # the process is gone by then: nothing to answer
                self.close_connection = True
                return
            inv.first_next = time.perf_counter()
            self.send_response(200)
            for k, v in {
                "Lambda-Runtime-Aws-Request-Id": "bench-request-1",
                "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + 15_000),
                "Lambda-Runtime-Invoked-Function-Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:bench",
                "Lambda-Runtime-Trace-Id": "Root=1-00000000-000000000000000000000000;Sampled=0",
                "Content-Type": "application/json",
                "Content-Length": str(len(inv.event)),
            }.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(inv.event)

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if inv.answered is None and re.search(r"/runtime/(invocation/[^/]+/(response|error)|init/error)$", self.path):
                inv.answered = time.perf_counter()
                inv.outcome = self.path.rsplit("/", 1)[-1] + (": " + body[:160].decode(errors="replace") if "error" in self.path else "")
                inv.done.set()
            self._reply(202, b"{}")

        def _reply(self, status: int, data: bytes):
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_):
            pass

    server = QuietServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1))


def cold_start(argv: list[str], env: dict, event: bytes, timeout: float = 30.0) -> dict:
    inv = Invocation(event)
    api = runtime_api(inv)
    env = dict(env, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{api.server_address[1]}")
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finished = inv.done.wait(timeout)
        exited = proc.poll()
        rss = peak_rss_kib(proc.pid) if exited is None else None
        proc.kill()
        proc.wait()
        inv.release.set()
        api.shutdown()
        if not finished or exited is not None or inv.first_next is None:
            log.seek(0)
            tail = log.read()[-600:].decode(errors="replace")
            raise RuntimeError(f"{argv[-1]}: no answer (exit {exited}); output:\n{tail}")
    return {
        "init_ms": (inv.first_next - t0) * 1000,
        "first_invoke_ms": (inv.answered - inv.first_next) * 1000,
        "peak_rss_mib": rss / 1024,
        "outcome": inv.outcome,
    }


# ------------------------------------------------ each function's setup
def functions(aws_endpoint: str) -> list[dict]:
    """Handler, environment and SDK clients of each function of the template."""
    t = template_check.translate(PARAMS)
    values = dict(template_check._parameter_values(template_check.load(), PARAMS))
    resources = t["Resources"]

    def ref(name: str) -> str:
        if name in values:
            return str(values[name])
        if name == "AWS::Region":
            return REGION
        if name in ("AWS::AccountId",):
            return ACCOUNT
        if name == "AWS::URLSuffix":
            return "amazonaws.com"
        if name == "AWS::StackName":
            return "order-expiry"
        kind = resources.get(name, {}).get("Type", "")
        if kind == "AWS::SQS::Queue":
            return f"{aws_endpoint}/{ACCOUNT}/{name}"
        return name

    def resolve(v):
        if isinstance(v, (str, int, float)):
            return str(v)
        if "Ref" in v:
            return ref(v["Ref"])
        if "Fn::GetAtt" in v:
            rid, attr = v["Fn::GetAtt"]
            return f"arn:aws:{rid.lower()}:{REGION}:{ACCOUNT}:{rid}" if attr == "Arn" else f"{rid}-{attr}"
        if "Fn::Sub" in v:
            text = v["Fn::Sub"] if isinstance(v["Fn::Sub"], str) else v["Fn::Sub"][0]
            return re.sub(r"\$\{([^}]+)\}", lambda m: ref(m.group(1).split(".")[0]), text)
        raise ValueError(f"cannot resolve {v}")

    sources = template_check.rust_sources("shared/src")
    out = []
    for _, res in sorted(resources.items()):
        if res["Type"] != "AWS::Lambda::Function":
            continue
        props = res["Properties"]
        handler = props["Handler"]
        variables = props.get("Environment", {}).get("Variables", {})
        env = {k: resolve(v) for k, v in variables.items()}
        env["RUST_LOG"] = "error"  # the figure is start-up, not log volume
        with open(os.path.join(ROOT, template_check.BOOTSTRAP_SRC, handler.replace("-", "_") + ".rs")) as f:
            crates = sorted(template_check.clients_built(f.read(), sources))
        out.append({"handler": handler, "name": props.get("FunctionName", handler), "env": env,
                    "clients": [BOTO3_SERVICE[c] for c in crates]})
    return sorted(out, key=lambda f: f["handler"])


# The trust store as Lambda's al2023 image lays it out: one PEM bundle and
# no per-certificate files. The SDK's rustls loads the system's roots at
# client creation (rustls-native-certs: the bundle file plus every file of
# the certificate directory); on a Debian host that directory holds each
# root again as its own file, so without these two variables the Rust init
# would parse every root twice, which Lambda never does. `SSL_CERT_FILE`
# alone makes rustls-native-certs read that file only. Set by
# `--cert-layout al2023` (the default); `host` leaves the host's layout.
AL2023_CERTS = {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def base_env(aws_endpoint: str, fn: dict, cert_layout: str = "al2023") -> dict:
    return {
        **(AL2023_CERTS if cert_layout == "al2023" else {}),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_ENDPOINT_URL": aws_endpoint,
        "AWS_LAMBDA_FUNCTION_NAME": f"order-expiry-{fn['handler']}",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_STREAM_NAME": "bench", "_HANDLER": fn["handler"],
        **fn["env"],
    }


def zipped_size(path: str) -> int:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(path, "bootstrap")
    return len(buf.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.path.join(ROOT, "target/lambda-x86_64/bootstrap/bootstrap"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", help="comma-separated handler names")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--cert-layout", choices=["al2023", "host"], default="al2023",
                    help="al2023: one CA bundle, as in Lambda's image (default); host: this machine's "
                         "bundle plus its per-certificate directory")
    args = ap.parse_args()
    if not os.path.isfile(args.bootstrap):
        sys.exit(f"no bootstrap at {args.bootstrap}: infra/release.sh --arch x86_64 --lambda-dir target/lambda-x86_64")

    aws = QuietServer(("127.0.0.1", 0), FakeAws)
    threading.Thread(target=aws.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{aws.server_address[1]}"
    fns = functions(endpoint)
    if args.only:
        fns = [f for f in fns if f["handler"] in args.only.split(",")]
    python_ref = [sys.executable, os.path.join(ROOT, "bench/bench_python_handler.py")]
    import boto3  # noqa: F401  (only its version, for the table)

    raw = os.path.getsize(args.bootstrap)
    print(f"bootstrap {args.bootstrap}: {raw / 2**20:.1f} MiB, zipped {zipped_size(args.bootstrap) / 2**20:.1f} MiB "
          f"(one file for all {len(fns)} functions); Python reference: {sys.version.split()[0]}, "
          f"boto3 {sys.modules['boto3'].__version__} (in the Lambda Python runtime: the handler zip is "
          f"{os.path.getsize(python_ref[1]) / 1024:.1f} KiB of source); {args.runs} runs each, medians; "
          f"trust store layout: {args.cert_layout}")
    print(f"{'function':<16} {'clients':<26} {'Rust init':>10} {'1st invoke':>11} {'peak RSS':>9} | "
          f"{'Python init':>11} {'1st invoke':>11} {'peak RSS':>9}  first answer (Rust)")
    results = []
    for fn in fns:
        event_file = EVENTS.get(fn["handler"])
        event = open(os.path.join(ROOT, "events", event_file), "rb").read() if event_file else b"{}"
        env = base_env(endpoint, fn, args.cert_layout)
        row = {"handler": fn["handler"], "clients": fn["clients"], "rust": [], "python": []}
        for _ in range(args.runs):
            row["rust"].append(cold_start([args.bootstrap], env, event))
            row["python"].append(cold_start(python_ref, dict(env, BENCH_CLIENTS=",".join(fn["clients"])), event))
        results.append(row)

        def med(side, key):
            return statistics.median(r[key] for r in row[side])

        print(f"{fn['handler']:<16} {','.join(fn['clients']):<26} {med('rust', 'init_ms'):>8.1f}ms "
              f"{med('rust', 'first_invoke_ms'):>9.1f}ms {med('rust', 'peak_rss_mib'):>6.1f}MiB | "
              f"{med('python', 'init_ms'):>9.1f}ms {med('python', 'first_invoke_ms'):>9.1f}ms "
              f"{med('python', 'peak_rss_mib'):>6.1f}MiB  {row['rust'][0]['outcome'][:60]}", flush=True)
    aws.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bootstrap": args.bootstrap, "bytes": raw, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
