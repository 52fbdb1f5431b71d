#!/usr/bin/env python3
"""Template checks that stand in for what the local emulator cannot enforce.

ministack runs every function with the same credentials and checks no IAM
policy, so the end-to-end tests pass whatever the roles say. These checks
read the template instead, as CloudFormation would see it after the SAM
transform, for the dev and the prod parameter sets:

  roles     every role: no `Resource: "*"` except on logs/X-Ray telemetry,
            no wildcard actions; each function's role grants exactly what
            infra/iam-actions.yaml lists for it (nothing more, nothing less)
  mappings  every queue or stream trigger is an explicit event source mapping
            (SAM `Events` of type SQS/DynamoDB attach AWS-managed policies on
            `Resource: "*"`), its role may poll exactly that source, and every
            SQS mapping is capped with ScalingConfig.MaximumConcurrency
  code      grep-level, the list against the Rust code: every listed call is
            made somewhere, every SDK operation the code makes is listed, and
            a function lists no service whose client its own wiring never
            builds (functions/bootstrap/src/<handler>.rs, the module its
            Handler selects in the one bootstrap's main.rs)

  baseline  the translation (dev and prod) is the one recorded in
            tests/fixtures/template_inventory/ (every resource, output,
            condition, rule and parameter, each by the hash of its JSON),
            and ministack's AWS::LanguageExtensions expands the template as
            cfn-lint's does

Usage: .venv/bin/python infra/template_check.py [roles|mappings|code|baseline|all]
       .venv/bin/python infra/template_check.py translate <dev|prod> [out.json]
       .venv/bin/python infra/template_check.py expand [out.json]
       .venv/bin/python infra/template_check.py inventory [--write] [--template PATH]
Exit status 1 with one line per finding when a check fails.

`translate(params)` is reusable: the template as deployed with `params`,
conditions evaluated, resources whose condition is false removed, `Fn::If`
resolved.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import sys
from typing import Any, Callable

from cfnlint.decode import cfn_yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "template.yaml")
ACTIONS = os.path.join(ROOT, "infra", "iam-actions.yaml")

# The parameter sets the checks translate with: the local/test deploy (dev,
# sandbox on, as infra/local.sh deploys) and a production stack (defaults).
PARAM_SETS: dict[str, dict[str, str]] = {
    "dev": {
        "Stage": "dev", "EnableSandboxChannel": "true", "FaultInjection": "on", "LocalApiId": "abc123",
        "StripeApiBaseUrl": "http://127.0.0.1:8420", "StripeTestServer": "localstripe",
    },
    "prod": {"Stage": "prod"},
}

NO_VALUE = {"Ref": "AWS::NoValue"}
LANGUAGE_EXTENSIONS = "AWS::LanguageExtensions"


# ---------------------------------------------------------------- translation
def load(path: str = TEMPLATE, expand: bool = True) -> dict:
    """The template as plain dicts and lists; with `expand`, after the
    AWS::LanguageExtensions transform (loops written out, per-item map values
    filled in), i.e. what the SAM transform and every check sees."""
    with open(path) as f:
        template = cfn_yaml.loads(f.read(), path)
    if expand and LANGUAGE_EXTENSIONS in declared_transforms(template):
        # A loop's `!Sub ["...${Name}", {Name: !FindInMap ...}]` as the
        # string it stands for (see normalized), as if written out by hand.
        template = normalized(expand_language_extensions(template, path))
    # Plain dicts and lists (the loader's node types carry positions).
    return json.loads(json.dumps(template))


def declared_transforms(template: dict) -> list:
    declared = template.get("Transform", [])
    return declared if isinstance(declared, list) else [declared]


def expand_language_extensions(template: dict, path: str | None = None) -> dict:
    """AWS::LanguageExtensions applied, when the template declares it:
    every `Fn::ForEach` expanded, `Fn::FindInMap` keyed by a loop identifier
    resolved, `${Item}` filled into keys and `Fn::Sub`s. The expander is
    cfn-lint's (cfnlint.template.transforms, the one `cfn-lint` itself lints
    the expanded template with); the transform is dropped from `Transform`,
    so the SAM transform comes next, as CloudFormation applies them."""
    transforms = declared_transforms(template)
    if LANGUAGE_EXTENSIONS not in transforms:
        return template
    from cfnlint.template import Template
    from cfnlint.template.transforms._language_extensions import language_extension

    import copy

    cfn = Template(path, copy.deepcopy(template), ["us-east-1"])
    # Template() rewrites its copy's conditions (the operands of Fn::Equals
    # put in order); the loops are expanded over the template as written.
    cfn.template = template
    matches, expanded = language_extension(cfn)
    if matches:
        raise ValueError(f"{path}: {LANGUAGE_EXTENSIONS}: " + "; ".join(m.message for m in matches))
    rest = [t for t in transforms if t != LANGUAGE_EXTENSIONS]
    if rest:
        expanded["Transform"] = rest[0] if len(rest) == 1 else rest
    else:
        expanded.pop("Transform", None)
    return expanded


class _NoManagedPolicies:
    """The SAM translator's managed-policy loader, without IAM: the template
    names managed policies by ARN only (SAM itself adds the Lambda ones)."""

    def load(self) -> dict:
        return {}


def _parameter_values(template: dict, params: dict) -> dict:
    values = {k: str(p["Default"]) for k, p in template.get("Parameters", {}).items() if "Default" in p}
    values.update({k: str(v) for k, v in params.items()})
    unknown = set(params) - set(template.get("Parameters", {}))
    if unknown:
        raise ValueError(f"not parameters of the template: {sorted(unknown)}")
    return values


def _condition(expr: Any, values: dict, conditions: dict, memo: dict) -> Any:
    """Evaluates a condition expression (or a value inside one)."""
    if isinstance(expr, dict) and len(expr) == 1:
        (fn, arg), = expr.items()
        ev = lambda e: _condition(e, values, conditions, memo)  # noqa: E731
        if fn == "Fn::Equals":
            return str(ev(arg[0])) == str(ev(arg[1]))
        if fn == "Fn::Not":
            return not ev(arg[0])
        if fn == "Fn::And":
            return all(ev(a) for a in arg)
        if fn == "Fn::Or":
            return any(ev(a) for a in arg)
        if fn == "Condition":
            return _named_condition(arg, values, conditions, memo)
        if fn == "Ref":
            if arg not in values:
                raise ValueError(f"condition refers to {arg}, which has no value")
            return values[arg]
        raise ValueError(f"unsupported function in a condition: {fn}")
    return expr


def _named_condition(name: str, values: dict, conditions: dict, memo: dict) -> bool:
    if name not in memo:
        memo[name] = bool(_condition(conditions[name], values, conditions, memo))
    return memo[name]


def _resolve_ifs(node: Any, truth: dict) -> Any:
    """`Fn::If` replaced by its chosen branch; `AWS::NoValue` removed."""
    if isinstance(node, dict):
        if len(node) == 1 and "Fn::If" in node:
            name, yes, no = node["Fn::If"]
            return _resolve_ifs(yes if truth[name] else no, truth)
        out = {}
        for k, v in node.items():
            v = _resolve_ifs(v, truth)
            if v != NO_VALUE:
                out[k] = v
        return out
    if isinstance(node, list):
        return [v for v in (_resolve_ifs(v, truth) for v in node) if v != NO_VALUE]
    return node


def translate(params: dict, path: str = TEMPLATE) -> dict:
    """The template as CloudFormation deploys it with `params` (the others at
    their defaults): SAM-transformed, every condition evaluated, resources and
    outputs under a false condition removed, `Fn::If` resolved."""
    from samtranslator.translator.transform import transform

    template = load(path)
    values = _parameter_values(template, params)
    for res in template.get("Resources", {}).values():
        if res.get("Type") == "AWS::Serverless::Function":
            code = res.setdefault("Properties", {}).get("CodeUri")
            if isinstance(code, str):  # a local build folder: any S3 location will do
                res["Properties"]["CodeUri"] = {"Bucket": "artifacts", "Key": os.path.basename(code.rstrip("/"))}
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    # The translator warns at exit about usage metrics it never publishes.
    logging.getLogger("samtranslator").setLevel(logging.ERROR)
    out = transform(template, dict(values), _NoManagedPolicies())
    conditions = out.get("Conditions", {})
    memo: dict = {}
    truth = {name: _named_condition(name, values, conditions, memo) for name in conditions}
    for section in ("Resources", "Outputs"):
        out[section] = {
            k: v for k, v in out.get(section, {}).items() if "Condition" not in v or truth[v["Condition"]]
        }
    return _resolve_ifs(out, truth)


# ------------------------------------------------------------------- the list
Entry = tuple[str, str]  # (IAM action, SDK operation that needs it)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def parse_entry(text: str) -> Entry:
    m = re.fullmatch(r"\s*([a-z0-9-]+:[A-Za-z]+)(?:\s+via\s+([a-z_]+))?\s*", text)
    if not m:
        raise ValueError(f"iam-actions.yaml: cannot read {text!r} (want 'service:Action [via sdk_operation]')")
    action, via = m.groups()
    return action, via or snake(action.split(":")[1])


def load_list(path: str = ACTIONS) -> tuple[dict, list[str]]:
    """{function: {"code"|"lambda": {resource: [Entry]}}}, pending calls."""
    raw = load(path)
    pending = raw.pop("pending_calls", []) or []
    out: dict = {}
    for fn, sections in raw.items():
        extra = set(sections) - {"code", "lambda"}
        if extra:
            raise ValueError(f"iam-actions.yaml: {fn}: unknown sections {sorted(extra)}")
        out[fn] = {
            kind: {res: [parse_entry(a) for a in actions] for res, actions in (sections.get(kind) or {}).items()}
            for kind in ("code", "lambda")
        }
    return out, pending


# --------------------------------------------------------------- role reading
# The AWS-managed policies SAM attaches, as the statements they hold (only
# the ones known here can be judged; any other managed policy is a finding).
MANAGED = {
    "AWSLambdaBasicExecutionRole": [("logs:CreateLogGroup", "*"), ("logs:CreateLogStream", "*"), ("logs:PutLogEvents", "*")],
    "AWSXrayWriteOnlyAccess": [
        ("xray:PutTraceSegments", "*"), ("xray:PutTelemetryRecords", "*"), ("xray:GetSamplingRules", "*"),
        ("xray:GetSamplingTargets", "*"), ("xray:GetSamplingStatisticSummaries", "*"),
    ],
    "AWSLambdaSQSQueueExecutionRole": [
        ("sqs:ReceiveMessage", "*"), ("sqs:DeleteMessage", "*"), ("sqs:GetQueueAttributes", "*"),
        ("logs:CreateLogGroup", "*"), ("logs:CreateLogStream", "*"), ("logs:PutLogEvents", "*"),
    ],
    "AWSLambdaDynamoDBExecutionRole": [
        ("dynamodb:DescribeStream", "*"), ("dynamodb:GetRecords", "*"), ("dynamodb:GetShardIterator", "*"),
        ("dynamodb:ListStreams", "*"),
        ("logs:CreateLogGroup", "*"), ("logs:CreateLogStream", "*"), ("logs:PutLogEvents", "*"),
    ],
}
# Telemetry every function writes (from the two managed policies above):
# allowed on "*" (X-Ray has no resource-level permissions; log writes are
# not data), and not part of iam-actions.yaml.
TELEMETRY = {a for name in ("AWSLambdaBasicExecutionRole", "AWSXrayWriteOnlyAccess") for a, _ in MANAGED[name]}

ARN_PREFIX = re.compile(r"^arn:\$\{AWS::Partition\}:([a-z0-9-]+):\$\{AWS::Region\}:\$\{AWS::AccountId\}:")


def resource_name(expr: Any) -> str:
    """A statement's resource as iam-actions.yaml names it."""
    if expr == "*":
        return "*"
    if isinstance(expr, dict) and len(expr) == 1:
        (fn, arg), = expr.items()
        if fn == "Fn::GetAtt":
            res, attr = arg if isinstance(arg, list) else arg.split(".", 1)
            return res if attr == "Arn" else f"{res}.{attr}"
        if fn == "Ref":
            return arg
        if fn == "Fn::Sub":
            text, subs = (arg, {}) if isinstance(arg, str) else arg
            for var, val in subs.items():
                text = text.replace("${" + var + "}", "${" + resource_name(val) + "}")
            text = re.sub(r"\$\{([A-Za-z0-9]+)\.Arn\}", r"\1", text)
            m = ARN_PREFIX.match(text)
            return f"{m.group(1)}:{text[m.end():]}" if m else text
    return json.dumps(expr, sort_keys=True)


def as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def role_grants(role: dict, problems: list[str], rid: str) -> set[tuple[str, str]]:
    """Every (action, resource name) a role allows."""
    grants: set[tuple[str, str]] = set()
    props = role.get("Properties", {})
    for arn in props.get("ManagedPolicyArns", []):
        name = arn.rsplit("/", 1)[-1] if isinstance(arn, str) else resource_name(arn).rsplit("/", 1)[-1]
        if name not in MANAGED:
            problems.append(f"{rid}: managed policy {arn} is not one this check knows; write its statements out")
            continue
        grants.update(MANAGED[name])
    for policy in props.get("Policies", []):
        for st in as_list(policy.get("PolicyDocument", {}).get("Statement", [])):
            if st.get("Effect") != "Allow":
                continue
            if "NotAction" in st or "NotResource" in st:
                problems.append(f"{rid}: a statement with NotAction/NotResource allows more than it names")
                continue
            for action in as_list(st.get("Action", [])):
                for res in as_list(st.get("Resource", [])):
                    grants.add((action, resource_name(res)))
    return grants


def function_roles(t: dict) -> dict[str, str]:
    """{function logical id: role logical id} (SAM names the function's own
    logical id on the AWS::Lambda::Function it generates)."""
    out = {}
    for fid, res in t["Resources"].items():
        if res["Type"] == "AWS::Lambda::Function":
            role = res["Properties"].get("Role")
            if isinstance(role, dict) and "Fn::GetAtt" in role:
                out[fid] = role["Fn::GetAtt"][0]
    return out


def names_present(name: str, t: dict) -> bool:
    """Whether every logical id a list resource name refers to exists in
    this translation (the sandbox ledger only exists with the sandbox on)."""
    ids = re.findall(r"\$\{([A-Za-z0-9]+)\}", name)
    if not ids:
        ids = [re.split(r"[./]", name)[0]]
    return all(i in t["Resources"] or i in t.get("Parameters", {}) for i in ids if "*" not in i)


# --------------------------------------------------------------------- checks
def check_roles() -> list[str]:
    listed, _ = load_list()
    problems: list[str] = []
    declared = load()["Resources"]
    for stage, params in PARAM_SETS.items():
        t = translate(params)
        roles = {rid: r for rid, r in t["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
        fn_roles = function_roles(t)
        for fn in listed:
            # A function under a false condition is simply not deployed here.
            if fn not in declared:
                problems.append(f"iam-actions.yaml names {fn}, which is not a function of the template")
        for rid, role in roles.items():
            here: list[str] = []
            grants = role_grants(role, here, rid)
            for action, res in sorted(grants):
                if "*" in action:
                    here.append(f"{rid}: wildcard action {action}")
                if res == "*" and action not in TELEMETRY:
                    here.append(f"{rid}: {action} on Resource \"*\"")
            fn = next((f for f, r in fn_roles.items() if r == rid), None)
            if fn is not None:
                if fn not in listed:
                    here.append(f"{rid}: function {fn} has no entry in iam-actions.yaml")
                else:
                    allowed = {
                        (action, res)
                        for kind in ("code", "lambda")
                        for res, entries in listed[fn][kind].items()
                        for action, _ in entries
                    }
                    for action, res in sorted(grants):
                        if res == "*" and action in TELEMETRY:
                            continue
                        if not any(a == action and fnmatch.fnmatchcase(res, r) for a, r in allowed):
                            here.append(f"{rid}: {action} on {res} is not listed for {fn} in iam-actions.yaml")
                    for action, res in sorted(allowed):
                        if not names_present(res, t):
                            continue
                        if not any(a == action and fnmatch.fnmatchcase(g, res) for a, g in grants):
                            here.append(f"{rid}: lacks {action} on {res}, which iam-actions.yaml lists for {fn}")
            problems.extend(f"[{stage}] {p}" for p in here)
    return sorted(set(problems))


POLLER_ACTIONS = {
    "SQS": {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"},
    "DynamoDB": {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"},
}


def check_mappings() -> list[str]:
    listed, _ = load_list()
    problems: list[str] = []
    for fid, res in load()["Resources"].items():
        if res["Type"] != "AWS::Serverless::Function":
            continue
        for name, ev in (res["Properties"].get("Events") or {}).items():
            if ev.get("Type") in ("SQS", "DynamoDB", "Kinesis", "MQ", "MSK", "SelfManagedKafka", "DocumentDB"):
                problems.append(
                    f"{fid}: event {name} of type {ev['Type']} makes SAM attach an AWS-managed policy on "
                    f"Resource \"*\"; declare an AWS::Lambda::EventSourceMapping instead"
                )
    for stage, params in PARAM_SETS.items():
        t = translate(params)
        fn_roles = function_roles(t)
        seen: dict[str, set[str]] = {}
        for mid, m in t["Resources"].items():
            if m["Type"] != "AWS::Lambda::EventSourceMapping":
                continue
            p = m["Properties"]
            fn_ref = p.get("FunctionName")
            fn = fn_ref.get("Ref") if isinstance(fn_ref, dict) else None
            if fn not in fn_roles:
                problems.append(f"[{stage}] {mid}: FunctionName must be a Ref to a function of the template")
                continue
            source = resource_name(p.get("EventSourceArn"))
            kind = "DynamoDB" if source.endswith(".StreamArn") else "SQS"
            rid = fn_roles[fn]
            grants = role_grants(t["Resources"][rid], problems, rid)
            want = {(a, source) for a in POLLER_ACTIONS[kind]}
            dest = p.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            if dest is not None:
                want.add(("sqs:SendMessage", resource_name(dest)))
            for action, res in sorted(want - grants):
                problems.append(f"[{stage}] {mid}: the role of {fn} lacks {action} on {res}, which the mapping needs")
            lam = {(a, r) for r, entries in listed.get(fn, {}).get("lambda", {}).items() for a, _ in entries}
            for action, res in sorted(want - lam):
                problems.append(f"[{stage}] {mid}: iam-actions.yaml does not list {action} on {res} under {fn}.lambda")
            seen.setdefault(fn, set()).update(r for _, r in want)
            # Capped on AWS; the local stack (LocalApiId set) runs uncapped,
            # as ministack stops polling on a parameter-valued cap.
            if kind == "SQS" and not params.get("LocalApiId"):
                cap = p.get("ScalingConfig", {}).get("MaximumConcurrency")
                if cap is None:
                    problems.append(f"[{stage}] {mid}: an SQS mapping without ScalingConfig.MaximumConcurrency")
        for fn, sections in listed.items():
            if fn not in fn_roles:
                continue
            for res in sections["lambda"]:
                polled = any(a in POLLER_ACTIONS["SQS"] | POLLER_ACTIONS["DynamoDB"] for a, _ in sections["lambda"][res])
                if polled and res not in seen.get(fn, set()) and names_present(res, t):
                    problems.append(f"[{stage}] iam-actions.yaml lets {fn} poll {res}, but no mapping of {fn} reads it")
    return sorted(set(problems))


# Crate of each service prefix, and of the operations named by `via`.
CRATE = {"dynamodb": "dynamodb", "sqs": "sqs", "scheduler": "scheduler", "ssm": "ssm", "events": "eventbridge"}
VIA_CRATE = {"transact_write_items": "dynamodb", "send_message_batch": "sqs", "create_schedule": "scheduler"}
# Method calls on an SDK client: `client.op()`, `client().op()`, `sqs.op()`,
# `Client::new(config).op()`, across line breaks.
SDK_CALL = re.compile(r"(?:\bclient(?:\(\))?|\bsqs|Client::new\([^()]*\))\s*\.\s*([a-z_]+)\(\)")
NOT_OPERATIONS = {"clone", "config"}
# The one binary of every function and where its per-function wiring lives.
BOOTSTRAP_SRC = "functions/bootstrap/src"
BOOTSTRAP_MAIN = f"{BOOTSTRAP_SRC}/main.rs"


def rust_sources(*dirs: str) -> dict[str, str]:
    out = {}
    for d in dirs:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith(".rs"):
                    path = os.path.join(base, f)
                    with open(path) as fh:
                        out[os.path.relpath(path, ROOT)] = fh.read()
    return out


def clients_built(main: str, shared: dict[str, str]) -> set[str]:
    """The SDK crates whose clients a function's wiring module builds,
    itself or through a shared constructor that takes the SdkConfig."""
    # `order_core::aws::clients::<crate>(config)` builds that crate's client
    # (with the lost-response drill's interceptor when it is on).
    built = r"aws_sdk_([a-z0-9]+)::Client::new|\bclients::([a-z0-9]+)\("
    crates = {a or b for a, b in re.findall(built, main)}
    for path, src in shared.items():
        imported = re.search(r"use aws_sdk_([a-z0-9]+)::(?:\{[^}]*\bClient\b|Client\b)", src)
        for m in re.finditer(r"(?m)^(\s*)pub (?:async )?fn ([a-z_]+)\(\s*config: &aws_config::SdkConfig", src):
            indent, fn = m.groups()
            end = src.find("\n" + indent + "}", m.end())
            body = src[m.end(): end if end > 0 else None]
            made = [a or b for a, b in re.findall(built, body)]
            if not made and "Client::new(" in body and imported:
                made = [imported.group(1)]
            if not made:
                continue
            owner = None
            if indent:  # a method: the nearest `impl X` above it
                impls = re.findall(r"(?m)^impl(?:<[^>]*>)? ([A-Za-z]+)", src[: m.start()])
                owner = impls[-1] if impls else None
            called = f"{owner}::{fn}(" if owner else None
            if (called and called in main) or (not owner and re.search(rf"\b{fn}\(&?config\)", main)):
                crates.update(made)
    return crates


def check_code() -> list[str]:
    listed, pending = load_list()
    problems: list[str] = []
    shared = rust_sources("shared/src")
    functions = rust_sources("functions")
    code = "\n".join(list(shared.values()) + list(functions.values()))
    called = {m.group(1) for m in SDK_CALL.finditer(code)} - NOT_OPERATIONS
    template = load()
    listed_ops: set[str] = set()
    for fn, sections in listed.items():
        res = template["Resources"].get(fn)
        if res is None or res["Type"] != "AWS::Serverless::Function":
            problems.append(f"iam-actions.yaml names {fn}, which is not a function of template.yaml")
            continue
        # One bootstrap serves every function: the Handler names the
        # function's wiring module, which main.rs must dispatch to.
        handler = res["Properties"].get("Handler")
        if not isinstance(handler, str):
            problems.append(f"{fn}: no Handler of its own (it selects the function's wiring in {BOOTSTRAP_MAIN})")
            continue
        main_path = f"{BOOTSTRAP_SRC}/{handler.replace('-', '_')}.rs"
        main = functions.get(main_path)
        if main is None:
            problems.append(f"{fn}: Handler {handler} has no wiring module {main_path}")
            continue
        if f'"{handler}"' not in functions.get(BOOTSTRAP_MAIN, ""):
            problems.append(f"{fn}: Handler {handler} is not a handler name of {BOOTSTRAP_MAIN}")
        crates = clients_built(main, shared)
        for resource, entries in sections["code"].items():
            for action, op in entries:
                listed_ops.add(op)
                service = action.split(":")[0]
                crate = VIA_CRATE.get(op) if op != snake(action.split(":")[1]) else CRATE.get(service)
                if crate is None:
                    problems.append(f"{fn}: {action} via {op}: add the operation's crate to VIA_CRATE")
                elif crate not in crates:
                    problems.append(f"{fn}: lists {action} on {resource}, but {main_path} builds no aws_sdk_{crate} client")
                if op in pending:
                    if op in called:
                        problems.append(f"{op} is now called in the code: remove it from pending_calls in iam-actions.yaml")
                elif op not in called:
                    problems.append(f"{fn}: lists {action} ({op}), which the code never calls")
                index = re.search(r"/index/([A-Za-z0-9_.-]+)$", resource)
                if index and f'"{index.group(1)}"' not in code:
                    problems.append(f"{fn}: lists the index {index.group(1)}, which the code never names")
    for op in sorted(called - listed_ops):
        problems.append(f"the code calls the SDK operation {op}, which iam-actions.yaml lists for no function")
    for fn in sorted(r for r, v in template["Resources"].items() if v["Type"] == "AWS::Serverless::Function"):
        if fn not in listed:
            problems.append(f"{fn} has no entry in iam-actions.yaml")
    return sorted(set(problems))


# ------------------------------------------------------------------ baseline
# What the template deploys, per parameter set, recorded when template.yaml
# was rewritten with Fn::ForEach loops (issue 19): every resource, output and
# other section of the translation as a hash of its sorted-key JSON, plus
# each resource's type and each alarm's metric, so a difference names what
# changed. A deliberate change of the stack records the new inventory:
#   .venv/bin/python infra/template_check.py inventory --write
INVENTORY_DIR = os.path.join(ROOT, "tests", "fixtures", "template_inventory")
# Sections of the translation that only feed the others: Mappings is read
# by the loops and every lookup is resolved into the resources.
NOT_DEPLOYED = {"Mappings"}


def normalized(node: Any) -> Any:
    """A value as CloudFormation reads it: an `Fn::Sub` variable given as a
    plain string is that string in the text, and an `Fn::Sub` left without a
    variable is its string (the expanders write a loop's filled-in `!Sub` in
    either form)."""
    if isinstance(node, dict):
        sub = node.get("Fn::Sub") if len(node) == 1 else None
        if isinstance(sub, list) and len(sub) == 2 and isinstance(sub[0], str) and isinstance(sub[1], dict):
            # A variable whose value is a plain string is that string in the text.
            text, rest = sub[0], {}
            for var, value in sub[1].items():
                if isinstance(value, str):
                    text = text.replace("${" + var + "}", value)
                else:
                    rest[var] = value
            sub = [text, rest] if rest else text
        if isinstance(sub, str):
            return sub if "${" not in sub else {"Fn::Sub": sub}
        if sub is not None:
            return {"Fn::Sub": normalized(sub)}
        return {k: normalized(v) for k, v in node.items()}
    if isinstance(node, list):
        return [normalized(v) for v in node]
    return node


def digest(node: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(normalized(node), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def inventory(params: dict, path: str = TEMPLATE) -> dict:
    t = translate(params, path)
    resources = {}
    for rid, res in sorted(t.get("Resources", {}).items()):
        entry = {"type": res.get("Type"), "sha256": digest(res)}
        if res.get("Type") == "AWS::CloudWatch::Alarm":
            p = res.get("Properties", {})
            entry["metric"] = f"{p.get('Namespace')} {p.get('MetricName')} {p.get('ComparisonOperator')} {json.dumps(p.get('Threshold'))}"
        resources[rid] = entry
    return {
        "sha256": digest({k: v for k, v in t.items() if k not in NOT_DEPLOYED}),
        "sections": {k: digest(v) for k, v in sorted(t.items()) if k not in NOT_DEPLOYED | {"Resources", "Outputs"}},
        "resources": resources,
        "outputs": {k: digest(v) for k, v in sorted(t.get("Outputs", {}).items())},
    }


def inventory_path(stage: str) -> str:
    return os.path.join(INVENTORY_DIR, f"{stage}.json")


def write_inventory(path: str = TEMPLATE) -> None:
    os.makedirs(INVENTORY_DIR, exist_ok=True)
    for stage, params in PARAM_SETS.items():
        with open(inventory_path(stage), "w") as f:
            f.write(json.dumps(inventory(params, path), indent=1, sort_keys=True) + "\n")


def check_baseline() -> list[str]:
    """The template translates (dev and prod) to exactly the resources,
    outputs, conditions, rules and parameters recorded in
    tests/fixtures/template_inventory/; and ministack's own
    AWS::LanguageExtensions (what the local stack deploys through) expands
    it to what cfn-lint's expander does."""
    problems: list[str] = []
    for stage, params in PARAM_SETS.items():
        try:
            with open(inventory_path(stage)) as f:
                want = json.load(f)
        except FileNotFoundError:
            problems.append(f"[{stage}] no {os.path.relpath(inventory_path(stage), ROOT)} (template_check.py inventory --write)")
            continue
        got = inventory(params)
        if got["sha256"] == want["sha256"]:
            continue
        for section in ("resources", "outputs", "sections"):
            for key in sorted(set(want[section]) | set(got[section])):
                w, g = want[section].get(key), got[section].get(key)
                if w is None:
                    problems.append(f"[{stage}] {section}: {key} is new")
                elif g is None:
                    problems.append(f"[{stage}] {section}: {key} is gone")
                elif w != g:
                    problems.append(f"[{stage}] {section}: {key} differs ({json.dumps(w)} recorded, {json.dumps(g)} now)")
        if not problems:
            problems.append(f"[{stage}] the translation differs from the recorded one outside its sections")
    problems.extend(check_expanders_agree())
    return problems


def check_expanders_agree(path: str = TEMPLATE) -> list[str]:
    """cfn-lint's expansion (what every check reads) against ministack's
    (what the local stack deploys), for each parameter set."""
    try:
        from ministack.services.cloudformation import language_extensions as ministack_lx
    except ImportError:
        return ["ministack is not installed in this venv (infra/tools.sh installs it): its expansion cannot be compared"]
    with open(path) as f:
        raw = json.loads(json.dumps(cfn_yaml.loads(f.read(), path)))
    ours = normalized(load(path))
    ours.pop("Transform", None)
    problems = []
    for stage, params in PARAM_SETS.items():
        theirs = ministack_lx.apply(json.loads(json.dumps(raw)), _parameter_values(raw, params))
        theirs = normalized(theirs)
        theirs.pop("Transform", None)
        for section in sorted(set(ours) | set(theirs)):
            a, b = ours.get(section), theirs.get(section)
            if isinstance(a, dict) and isinstance(b, dict):
                for key in sorted(set(a) | set(b)):
                    if a.get(key) != b.get(key):
                        problems.append(f"[{stage}] {section}.{key}: cfn-lint and ministack expand it differently")
            elif a != b:
                problems.append(f"[{stage}] {section}: cfn-lint and ministack expand it differently")
    return problems


CHECKS: dict[str, Callable[[], list[str]]] = {
    "roles": check_roles, "mappings": check_mappings, "code": check_code, "baseline": check_baseline,
}


def main(argv: list[str]) -> int:
    if argv[1:2] == ["translate"]:
        # `translate <dev|prod> [out.json]`: the translated template, for
        # tools that read plain CloudFormation (checkov in infra/test.sh).
        stage = argv[2] if len(argv) > 2 else "prod"
        text = json.dumps(translate(PARAM_SETS[stage]), indent=1, sort_keys=True)
        if len(argv) > 3:
            with open(argv[3], "w") as f:
                f.write(text + "\n")
        else:
            print(text)
        return 0
    if argv[1:2] == ["expand"]:
        # `expand [out.json]`: the template with its AWS::LanguageExtensions
        # loops written out and the SAM transform still to come, for tools
        # that do not know Fn::ForEach (checkov in infra/test.sh).
        text = json.dumps(load(), indent=1, sort_keys=True)
        if len(argv) > 2:
            with open(argv[2], "w") as f:
                f.write(text + "\n")
        else:
            print(text)
        return 0
    if argv[1:2] == ["inventory"]:
        # `inventory [--write] [--template PATH]`: what the template deploys
        # (see check_baseline); --write records it as the baseline.
        path = argv[argv.index("--template") + 1] if "--template" in argv else TEMPLATE
        if "--write" in argv:
            write_inventory(path)
        else:
            print(json.dumps({s: inventory(p, path) for s, p in PARAM_SETS.items()}, indent=1, sort_keys=True))
        return 0
    names = argv[1:] or ["all"]
    if names == ["all"]:
        names = list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown check(s) {unknown}; one of {sorted(CHECKS)} or all", file=sys.stderr)
        return 2
    return run_checks({n: CHECKS[n] for n in names})


def run_checks(checks: dict[str, Callable[[], list[str]]]) -> int:
    """Runs each check, prints its findings (one line each) and its verdict;
    1 when any check found something (the template check scripts' CLI)."""
    failed = False
    for name, check in checks.items():
        problems = check()
        for p in problems:
            print(f"{name}: {p}")
        print(f"{name}: {'FAILED, ' + str(len(problems)) + ' finding(s)' if problems else 'ok'}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
