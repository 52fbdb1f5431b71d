#!/usr/bin/env python3
"""Checks over template.yaml that nothing fails silently.

    infra/check_alarms.py [--template PATH] [CHECK ...]

CHECK is one or more of (default: all of them):
  actions         every CloudWatch alarm notifies an SNS topic of the stack
  log-groups      every function has its log group (/aws/lambda/<FunctionName>),
                  with the LogRetentionDays retention, and logs to it
  function-alarms every function has an Errors and a Throttles alarm
  queue-alarms    every dead-letter queue has a depth alarm, every other
                  queue an oldest-message-age alarm

A queue counts as a dead-letter queue when it is the target of a
RedrivePolicy, a DeadLetterConfig or an OnFailure destination, or when no
function consumes it (a parking place: whatever lands there waits for a
person, so any message is worth an alarm). A consumed queue drains by
itself, so what matters there is a message that stays too long.

The template is read raw (cfn-lint's YAML loader, as infra/deploy.py does),
before the SAM transform: the checks read what a person edits. Exit status 1
lists every problem found. Run with the repo's .venv python; the Rust test
tests/tests/template_alarms.rs runs each check.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Iterator

from cfnlint.decode import cfn_yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from template_check import run_checks  # noqa: E402

FUNCTION_TYPES = {"AWS::Serverless::Function", "AWS::Lambda::Function"}
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


CHECKS = {
    "actions": check_actions,
    "log-groups": check_log_groups,
    "function-alarms": check_function_alarms,
    "queue-alarms": check_queue_alarms,
}


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", default=os.path.join(root, "template.yaml"))
    ap.add_argument("checks", nargs="*", metavar="CHECK", help=f"one of {', '.join(CHECKS)} (default: all)")
    args = ap.parse_args()
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        ap.error(f"unknown check {unknown} (known: {', '.join(CHECKS)})")
    with open(args.template) as f:
        resources = cfn_yaml.loads(f.read(), args.template).get("Resources", {})
    return run_checks({n: functools.partial(CHECKS[n], resources) for n in args.checks or list(CHECKS)})


if __name__ == "__main__":
    sys.exit(main())
