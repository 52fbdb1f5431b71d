#!/usr/bin/env python3
"""Deploy template.yaml to a CloudFormation endpoint (ministack by default).

What `sam deploy` would do, without aws-sam-cli:
  1. for every AWS::Serverless::Function whose CodeUri is a local folder
     (target/lambda/<name>/), zip a `bootstrap` and upload it to an S3 bucket;
     the bootstrap comes from --bootstrap-dir/<name> when given (the host
     debug binary from `cargo build`), else from the CodeUri folder itself
     (cargo lambda output). Every function of this template runs the same
     bootstrap (functions/bootstrap, picked by its Handler), so each distinct
     file is zipped and uploaded once and the functions share its key;
  2. rewrite CodeUri to {Bucket, Key} and create or update the stack
     (the endpoint runs the SAM transform);
  3. wait for *_COMPLETE, print failures, write the outputs as KEY=VALUE lines.

Zips are deterministic (fixed timestamps), so unchanged code keeps its key.
Run with the repo's .venv python (boto3 + cfn-lint's YAML loader).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from cfnlint.decode import cfn_yaml

TEMPLATE_BODY_MAX_BYTES = 51_200
TERMINAL_OK = {"CREATE_COMPLETE", "UPDATE_COMPLETE"}
TERMINAL_BAD = {
    "CREATE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_COMPLETE",
    "DELETE_FAILED", "UPDATE_ROLLBACK_COMPLETE", "UPDATE_ROLLBACK_FAILED",
    "UPDATE_FAILED", "IMPORT_ROLLBACK_COMPLETE",
}


def log(msg: str) -> None:
    print(f"[deploy] {msg}", flush=True)


def snake(name: str) -> str:
    """CamelCase output key -> UPPER_SNAKE env name (CloseDlqUrl -> CLOSE_DLQ_URL)."""
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    return s.upper()


def zip_bootstrap(path: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        info = zipfile.ZipInfo("bootstrap", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o100755 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(path, "rb") as f:
            zf.writestr(info, f.read(), compresslevel=1)
    return buf.getvalue()


def package(template: dict, root: str, bootstrap_dir: str | None, s3, bucket: str) -> None:
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError:
        s3.create_bucket(Bucket=bucket)
    jobs = []  # (logical_id, props, name, src)
    for logical_id, res in template.get("Resources", {}).items():
        # A Fn::ForEach::<loop> entry is a list (the endpoint expands it);
        # the functions are written out, never made by a loop.
        if not isinstance(res, dict) or res.get("Type") != "AWS::Serverless::Function":
            continue
        props = res.setdefault("Properties", {})
        code_uri = props.get("CodeUri")
        if not isinstance(code_uri, str) or code_uri.startswith("s3://"):
            continue
        name = os.path.basename(os.path.normpath(code_uri))
        if bootstrap_dir:
            src = os.path.join(bootstrap_dir, name)
        else:
            src = os.path.join(root, code_uri, "bootstrap")
        if not os.path.isfile(src):
            sys.exit(f"[deploy] {logical_id}: no bootstrap at {src} (build first)")
        jobs.append((logical_id, props, name, src))
    # One zip and one upload per distinct file, however many functions run
    # it; zlib releases the GIL, so several files compress on every core.
    sources = sorted({os.path.realpath(src): name for _, _, name, src in jobs}.items())
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        blobs = list(pool.map(lambda s: zip_bootstrap(s[0]), sources))
    keys = {}
    for (src, name), blob in zip(sources, blobs):
        key = f"{name}/{hashlib.sha256(blob).hexdigest()[:20]}.zip"
        s3.put_object(Bucket=bucket, Key=key, Body=blob)
        log(f"{src} -> s3://{bucket}/{key} ({len(blob) / 1e6:.1f} MB)")
        keys[src] = key
    for logical_id, props, _, src in jobs:
        props["CodeUri"] = {"Bucket": bucket, "Key": keys[os.path.realpath(src)]}
    if jobs:
        log(f"{len(jobs)} functions share {len(keys)} bootstrap(s)")


def wait(cfn, stack: str, started: float, timeout: int) -> str:
    seen: set[str] = set()
    while True:
        status = cfn.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"]
        try:
            events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
        except ClientError:
            events = []
        for ev in reversed(events):
            if ev["EventId"] in seen:
                continue
            seen.add(ev["EventId"])
            if ev["ResourceStatus"].endswith("FAILED"):
                log(f"  {ev['LogicalResourceId']}: {ev['ResourceStatus']} {ev.get('ResourceStatusReason', '')}")
        if status in TERMINAL_OK or status in TERMINAL_BAD:
            return status
        if time.time() - started > timeout:
            return f"TIMEOUT ({status})"
        time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack-name", required=True)
    ap.add_argument("--template", default="template.yaml")
    ap.add_argument("--bucket", help="artifact bucket (default <stack>-artifacts)")
    ap.add_argument("--bootstrap-dir", help="take <dir>/<function-folder-name> as each bootstrap (e.g. target/debug)")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--outputs-env", help="write stack outputs as UPPER_SNAKE=VALUE lines to this file")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()

    root = os.path.dirname(os.path.abspath(args.template))
    with open(args.template) as f:
        template = cfn_yaml.loads(f.read(), args.template)
    cfg = Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=120)
    s3 = boto3.client("s3", config=cfg)
    cfn = boto3.client("cloudformation", config=cfg)

    t0 = time.time()
    package(template, root, args.bootstrap_dir, s3, args.bucket or f"{args.stack_name}-artifacts")
    log(f"packaged in {time.time() - t0:.1f}s")

    params = []
    for kv in args.param:
        k, _, v = kv.partition("=")
        params.append({"ParameterKey": k, "ParameterValue": v})
    body = json.dumps(template, separators=(",", ":"))
    caps = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
    # CloudFormation takes at most 51,200 bytes inline; a larger template goes
    # through the artifact bucket (up to 1 MB), as `sam deploy` does it.
    template_arg = {"TemplateBody": body}
    if len(body.encode()) > TEMPLATE_BODY_MAX_BYTES:
        bucket = args.bucket or f"{args.stack_name}-artifacts"
        key = f"templates/{hashlib.sha256(body.encode()).hexdigest()[:20]}.json"
        s3.put_object(Bucket=bucket, Key=key, Body=body.encode())
        template_arg = {"TemplateURL": f"{s3.meta.endpoint_url.rstrip('/')}/{bucket}/{key}"}
        log(f"template is {len(body) / 1e3:.0f} kB: passed as s3://{bucket}/{key}")

    t1 = time.time()
    try:
        existing = cfn.describe_stacks(StackName=args.stack_name)["Stacks"][0]["StackStatus"]
    except ClientError:
        existing = None
    if existing in {"ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED"}:
        log(f"stack is {existing}; deleting it first")
        cfn.delete_stack(StackName=args.stack_name)
        while True:
            try:
                cfn.describe_stacks(StackName=args.stack_name)
            except ClientError:
                break
            time.sleep(1)
        existing = None
    if existing:
        log(f"updating stack {args.stack_name}")
        try:
            cfn.update_stack(StackName=args.stack_name, Parameters=params, Capabilities=caps, **template_arg)
        except ClientError as e:
            if "No updates are to be performed" not in str(e):
                raise
            log("no changes")
    else:
        log(f"creating stack {args.stack_name}")
        cfn.create_stack(StackName=args.stack_name, Parameters=params, Capabilities=caps, **template_arg)
    status = wait(cfn, args.stack_name, t1, args.timeout)
    log(f"{args.stack_name}: {status} in {time.time() - t1:.1f}s")
    if status not in TERMINAL_OK:
        return 1

    outputs = cfn.describe_stacks(StackName=args.stack_name)["Stacks"][0].get("Outputs", [])
    if args.outputs_env:
        with open(args.outputs_env, "w") as f:
            for o in sorted(outputs, key=lambda o: o["OutputKey"]):
                f.write(f"{snake(o['OutputKey'])}={o['OutputValue']}\n")
        log(f"wrote {len(outputs)} outputs to {args.outputs_env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
