#!/usr/bin/env python3
"""Checks over template.yaml that nothing fails silently.

    infra/check_alarms.py [--template PATH] [--metrics FILE] [--runbooks PATH] [CHECK ...]

CHECK is one or more of (default: all of them):
  actions         every CloudWatch alarm notifies an SNS topic of the stack
  log-groups      every function has its log group (/aws/lambda/<FunctionName>),
                  with the LogRetentionDays retention, and logs to it
  function-alarms every function has an Errors and a Throttles alarm
  queue-alarms    every dead-letter queue has a depth alarm, every other
                  queue an oldest-message-age alarm
  metric-alarms   every alarm on the custom namespace (OrderExpiry) names a
                  metric the code emits, with exactly one of the dimension
                  sets the code emits it under, Stack = the stack's name
  dashboard       every dashboard body is JSON once its ${...} are
                  substituted, each ${...} names a parameter, a resource (or
                  its attribute) or a pseudo parameter, and every custom
                  metric it shows is emitted with the dimensions it names
  runbooks        docs/runbooks.md has an entry (a heading naming the
                  alarm's logical id) for every alarm, and none for an
                  alarm that does not exist

metric-alarms and dashboard need --metrics FILE: the code's metric
catalog as JSON, [{"name","unit","dimensions":[...]}] (what
order_core::metrics::catalog_json() returns; tests/tests/template_metrics.rs
writes it and runs these checks).

A queue counts as a dead-letter queue when it is the target of a
RedrivePolicy, a DeadLetterConfig or an OnFailure destination, or when no
function consumes it (a parking place: whatever lands there waits for a
person, so any message is worth an alarm). A consumed queue drains by
itself, so what matters there is a message that stays too long.

The template is read before the SAM transform (what a person edits), with
its AWS::LanguageExtensions loops written out (template_check.load, cfn-lint's
expander): every alarm and queue a Fn::ForEach makes is checked as if it
were written out. Exit status 1
lists every problem found. Run with the repo's .venv python; the Rust test
tests/tests/template_alarms.rs runs each check.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from template_check import load, run_checks  # noqa: E402

FUNCTION_TYPES = {"AWS::Serverless::Function", "AWS::Lambda::Function"}
CUSTOM_NAMESPACE = "OrderExpiry"
STACK_DIMENSION = "Stack"
PSEUDO_PARAMETERS = {"AWS::StackName", "AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::URLSuffix", "AWS::StackId"}
RETENTION_PARAMETER = "LogRetentionDays"


def refs(node) -> Iterator[str]:
    """Logical ids named by Ref / GetAtt anywhere under node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                yield value
            elif key == "Fn::GetAtt":
                target = value[0] if isinstance(value, list) else str(value).split(".")[0]
                yield target
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def under_keys(node, keys: set[str]) -> Iterator[object]:
    """Every value whose key is in keys, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys:
                yield value
            yield from under_keys(value, keys)
    elif isinstance(node, list):
        for item in node:
            yield from under_keys(item, keys)


def of_type(resources: dict, types: set[str]) -> dict:
    return {lid: r for lid, r in resources.items() if r.get("Type") in types}


def alarms(resources: dict) -> dict:
    return of_type(resources, {"AWS::CloudWatch::Alarm"})


def alarm_dimension(alarm: dict, name: str) -> set[str]:
    """Logical ids the alarm's dimension `name` refers to."""
    dims = alarm.get("Properties", {}).get("Dimensions", [])
    return {t for d in dims if d.get("Name") == name for t in refs(d.get("Value"))}


def has_alarm(resources: dict, namespace: str, metric: str, dimension: str, target: str) -> bool:
    for alarm in alarms(resources).values():
        p = alarm.get("Properties", {})
        if p.get("Namespace") == namespace and p.get("MetricName") == metric and target in alarm_dimension(alarm, dimension):
            return True
    return False


def sub_text(value) -> str | None:
    """The format string of a !Sub (either form), or a plain string."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        return sub if isinstance(sub, str) else sub[0]
    return None


# ------------------------------------------------------------------ checks
def check_actions(resources: dict) -> list[str]:
    topics = set(of_type(resources, {"AWS::SNS::Topic"}))
    if not topics:
        return ["the template has no AWS::SNS::Topic for alarms to notify"]
    problems = []
    for lid, alarm in sorted(alarms(resources).items()):
        actions = set(refs(alarm.get("Properties", {}).get("AlarmActions", [])))
        if not actions & topics:
            problems.append(f"{lid}: AlarmActions names no SNS topic of the stack ({sorted(topics)})")
    return problems


def check_log_groups(resources: dict) -> list[str]:
    groups = of_type(resources, {"AWS::Logs::LogGroup"})
    by_name = {sub_text(g.get("Properties", {}).get("LogGroupName")): lid for lid, g in groups.items()}
    problems = []
    for lid, fn in sorted(of_type(resources, FUNCTION_TYPES).items()):
        props = fn.get("Properties", {})
        name = sub_text(props.get("FunctionName"))
        if not name:
            problems.append(f"{lid}: no FunctionName, so its log group name is not known in advance")
            continue
        group_id = by_name.get(f"/aws/lambda/{name}")
        if group_id is None:
            problems.append(f"{lid}: no AWS::Logs::LogGroup named /aws/lambda/{name}")
            continue
        group = groups[group_id]
        if group.get("Properties", {}).get("RetentionInDays") != {"Ref": RETENTION_PARAMETER}:
            problems.append(f"{group_id}: RetentionInDays is not !Ref {RETENTION_PARAMETER}")
        if group.get("Condition") != fn.get("Condition"):
            problems.append(f"{group_id}: Condition {group.get('Condition')} differs from {lid}'s {fn.get('Condition')}")
        # Lambda creates a never-expiring group of the same name if it logs
        # before the declared group exists: the function must depend on it.
        linked = set(refs(props.get("LoggingConfig", {}))) | set(fn.get("DependsOn", []) or [])
        if group_id not in linked:
            problems.append(f"{lid}: neither LoggingConfig.LogGroup nor DependsOn names {group_id}")
    return problems


def check_function_alarms(resources: dict) -> list[str]:
    problems = []
    for lid in sorted(of_type(resources, FUNCTION_TYPES)):
        for metric in ("Errors", "Throttles"):
            if not has_alarm(resources, "AWS/Lambda", metric, "FunctionName", lid):
                problems.append(f"{lid}: no AWS/Lambda {metric} alarm on FunctionName !Ref {lid}")
    return problems


def consumed_queues(resources: dict) -> set[str]:
    consumed = set()
    for fn in of_type(resources, {"AWS::Serverless::Function"}).values():
        for event in (fn.get("Properties", {}).get("Events") or {}).values():
            if event.get("Type") == "SQS":
                consumed |= set(refs(event.get("Properties", {}).get("Queue")))
    for mapping in of_type(resources, {"AWS::Lambda::EventSourceMapping"}).values():
        consumed |= set(refs(mapping.get("Properties", {}).get("EventSourceArn")))
    return consumed


def dead_letter_targets(resources: dict) -> set[str]:
    keys = {"deadLetterTargetArn", "DeadLetterConfig", "OnFailure"}
    return {t for value in under_keys(resources, keys) for t in refs(value)}


def check_queue_alarms(resources: dict) -> list[str]:
    queues = of_type(resources, {"AWS::SQS::Queue"})
    consumed = consumed_queues(resources)
    targets = dead_letter_targets(resources)
    problems = []
    for lid in sorted(queues):
        if lid in targets and lid in consumed:
            problems.append(f"{lid}: a dead-letter target that a function also consumes")
        if lid in targets or lid not in consumed:
            if not has_alarm(resources, "AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", lid):
                problems.append(f"{lid}: a dead-letter queue without an ApproximateNumberOfMessagesVisible alarm")
        elif not has_alarm(resources, "AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", lid):
            problems.append(f"{lid}: a consumed queue without an ApproximateAgeOfOldestMessage alarm")
    return problems


def emitted_sets(catalog: list[dict]) -> dict[str, list[frozenset[str]]]:
    """Metric name -> the dimension sets the code emits it under: [Stack]
    alone, and [Stack, ...] for a metric with extra dimensions."""
    sets = {}
    for metric in catalog:
        full = frozenset(metric["dimensions"])
        sets[metric["name"]] = [frozenset([STACK_DIMENSION])] + ([full] if len(full) > 1 else [])
    return sets


def check_metric_alarms(resources: dict, catalog: list[dict] | None) -> list[str]:
    if catalog is None:
        return ["needs --metrics FILE (the code's metric catalog)"]
    sets = emitted_sets(catalog)
    problems = []
    for lid, alarm in sorted(alarms(resources).items()):
        p = alarm.get("Properties", {})
        if "Metrics" in p:
            problems.append(f"{lid}: metric math alarms are not checked (and the local emulator refuses them)")
            continue
        if p.get("Namespace") != CUSTOM_NAMESPACE:
            continue
        name = p.get("MetricName")
        if name not in sets:
            problems.append(f"{lid}: {CUSTOM_NAMESPACE}/{name} is not a metric the code emits")
            continue
        dims = p.get("Dimensions") or []
        names = frozenset(d.get("Name") for d in dims)
        if names not in sets[name]:
            problems.append(
                f"{lid}: dimensions {sorted(names)} watch nothing; {name} is emitted under "
                f"{[sorted(s) for s in sets[name]]}"
            )
        stack = [d.get("Value") for d in dims if d.get("Name") == STACK_DIMENSION]
        if stack and stack[0] != {"Ref": "AWS::StackName"}:
            problems.append(f"{lid}: the Stack dimension must be !Ref AWS::StackName, not {stack[0]}")
    return problems


SUB_VARIABLE = re.compile(r"\$\{([^}!]+)\}")


def dashboard_metric_rows(body: dict) -> Iterator[tuple[str, list]]:
    """(widget title, metric row) for every metric row of every widget; an
    expression-only row (a dict first) is skipped."""
    for widget in body.get("widgets", []):
        props = widget.get("properties", {})
        for row in props.get("metrics", []) or []:
            if isinstance(row, list) and row and isinstance(row[0], str):
                yield props.get("title", "?"), row


def check_dashboard(resources: dict, catalog: list[dict] | None, parameters: dict) -> list[str]:
    if catalog is None:
        return ["needs --metrics FILE (the code's metric catalog)"]
    sets = emitted_sets(catalog)
    dashboards = of_type(resources, {"AWS::CloudWatch::Dashboard"})
    if not dashboards:
        return ["the template has no AWS::CloudWatch::Dashboard"]
    problems = []
    for lid, dash in sorted(dashboards.items()):
        text = sub_text(dash.get("Properties", {}).get("DashboardBody"))
        if text is None:
            problems.append(f"{lid}: DashboardBody is not a string or a !Sub of one")
            continue
        for var in SUB_VARIABLE.findall(text):
            target = var.split(".")[0]
            if var not in PSEUDO_PARAMETERS and target not in resources and target not in parameters:
                problems.append(f"{lid}: ${{{var}}} names nothing in the template")
            elif target in resources and resources[target].get("Condition"):
                problems.append(f"{lid}: ${{{var}}} names a conditional resource (absent from some stacks)")
        try:
            # Each ${X} becomes @X@: a JSON-safe stand-in that still says
            # which variable stood there.
            body = json.loads(SUB_VARIABLE.sub(lambda m: f"@{m.group(1)}@", text))
        except json.JSONDecodeError as e:
            problems.append(f"{lid}: the body is not JSON once substituted: {e}")
            continue
        for title, row in dashboard_metric_rows(body):
            namespace, name, rest = row[0], row[1], row[2:]
            pairs = [x for x in rest if isinstance(x, str)]
            if len(pairs) % 2:
                problems.append(f"{lid} ({title}): {name}: dimensions are not name/value pairs")
                continue
            dims = dict(zip(pairs[::2], pairs[1::2]))
            if namespace != CUSTOM_NAMESPACE:
                continue
            if name not in sets:
                problems.append(f"{lid} ({title}): {CUSTOM_NAMESPACE}/{name} is not a metric the code emits")
            elif frozenset(dims) not in sets[name]:
                problems.append(
                    f"{lid} ({title}): {name} with {sorted(dims)} shows nothing; emitted under "
                    f"{[sorted(s) for s in sets[name]]}"
                )
            elif dims.get(STACK_DIMENSION) != "@AWS::StackName@":
                problems.append(f"{lid} ({title}): {name}: Stack must be ${{AWS::StackName}}")
    return problems


RUNBOOK_HEADING = re.compile(r"^#{2,4}\s+`?([A-Za-z0-9]+Alarm)`?\b", re.MULTILINE)


def check_runbooks(resources: dict, runbooks_path: str) -> list[str]:
    try:
        with open(runbooks_path) as f:
            text = f.read()
    except OSError as e:
        return [f"{runbooks_path}: {e}"]
    entries = RUNBOOK_HEADING.findall(text)
    ids = set(alarms(resources))
    problems = [f"{lid}: no runbook entry (a heading `### {lid}`) in {runbooks_path}" for lid in sorted(ids - set(entries))]
    problems += [f"{e}: a runbook entry for an alarm the template does not have" for e in sorted(set(entries) - ids)]
    problems += [f"{e}: more than one runbook entry" for e in sorted({e for e in entries if entries.count(e) > 1})]
    return problems


CHECKS = {
    "actions": check_actions,
    "log-groups": check_log_groups,
    "function-alarms": check_function_alarms,
    "queue-alarms": check_queue_alarms,
    "metric-alarms": check_metric_alarms,
    "dashboard": check_dashboard,
    "runbooks": check_runbooks,
}


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", default=os.path.join(root, "template.yaml"))
    ap.add_argument("--metrics", help="the code's metric catalog as JSON (order_core::metrics::catalog_json)")
    ap.add_argument("--runbooks", default=os.path.join(root, "docs", "runbooks.md"))
    ap.add_argument("checks", nargs="*", metavar="CHECK", help=f"one of {', '.join(CHECKS)} (default: all)")
    args = ap.parse_args()
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        ap.error(f"unknown check {unknown} (known: {', '.join(CHECKS)})")
    # Loops written out: the checks see every alarm and queue a loop makes.
    template = load(args.template)
    resources = template.get("Resources", {})
    catalog = None
    if args.metrics:
        with open(args.metrics) as f:
            catalog = json.load(f)
    extra = {
        "metric-alarms": (catalog,),
        "dashboard": (catalog, template.get("Parameters", {})),
        "runbooks": (args.runbooks,),
    }
    return run_checks(
        {n: functools.partial(CHECKS[n], resources, *extra.get(n, ())) for n in args.checks or list(CHECKS)}
    )


if __name__ == "__main__":
    sys.exit(main())
