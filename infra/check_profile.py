#!/usr/bin/env python3
"""Checks of the production profile that the local emulator cannot make.

ministack accepts the template's `Rules` without evaluating them and lets any
signature (or any Authorization header) through an AWS_IAM route, so the
end-to-end tests cannot show what a prod stack refuses or which routes need
which caller. These checks read the template as CloudFormation would:

  rules     the Rules evaluated for parameter sets that must be refused (prod
            with fault injection, the sandbox or the emulator's LocalApiId, the
            sandbox signing with the
            provider's secret, half an auth setting) and sets that must deploy
            (prod defaults, the local dev deploy, an external OIDC issuer)
  prod      a prod translation (defaults) has no sandbox resource or route, no
            fault switch in any function's environment, and the webhook knows
            no sandbox channel
  routes    every buyer route is behind the buyers' JWT authorizer, /admin/*
            and the sandbox's settle route need IAM, and only the payment
            notification route is open (its signature is checked in code)

Usage: .venv/bin/python infra/check_profile.py [rules|prod|routes|all]
Exit status 1 with one line per finding when a check fails.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from template_check import _condition, _parameter_values, load, run_checks, translate  # noqa: E402

# What infra/local.sh deploys (the parameters the Rules look at).
LOCAL_DEV = {"Stage": "dev", "EnableSandboxChannel": "true", "FaultInjection": "on",
             "WebhookSecretParameterName": "/order-expiry/webhook-secret",
             "SandboxWebhookSecretParameterName": "/order-expiry/sandbox-webhook-secret",
             "StripeApiBaseUrl": "http://127.0.0.1:8420", "StripeTestServer": "localstripe"}

# (parameters, the rule that must refuse them or None when they must deploy)
RULE_CASES: list[tuple[dict, str | None]] = [
    ({"Stage": "prod"}, None),
    (LOCAL_DEV, None),
    ({"Stage": "prod", "BuyerAuthIssuer": "https://login.example.com", "BuyerAuthAudience": "app-1,app-2"}, None),
    ({"Stage": "prod", "FaultInjection": "on"}, "ProdRefusesFaultInjection"),
    ({"Stage": "prod", "FaultLostAnswerRate": "0.05"}, "ProdRefusesFaultInjection"),
    ({**LOCAL_DEV, "FaultLostAnswerRate": "0.05"}, None),
    ({"Stage": "prod", "EnableSandboxChannel": "true"}, "ProdRefusesSandboxChannel"),
    ({"Stage": "prod", "LocalApiId": "abc123"}, "ProdRefusesLocalApiId"),
    ({"Stage": "prod", "StripeApiBaseUrl": "http://127.0.0.1:8420"}, "ProdTalksToStripe"),
    ({"Stage": "prod", "StripeTestServer": "localstripe"}, "ProdTalksToStripe"),
    ({"Stage": "dev", "EnableSandboxChannel": "true",
      "SandboxWebhookSecretParameterName": "/order-expiry/webhook-secret"}, "SandboxHasItsOwnSecret"),
    ({"Stage": "prod", "PaymentChannelName": "sandbox"}, "SandboxHasItsOwnSecret"),
    ({"Stage": "prod", "BuyerAuthIssuer": "https://login.example.com"}, "ExternalIssuerNeedsAudience"),
    ({"Stage": "prod", "BuyerAuthAudience": "app-1"}, "AudienceNeedsExternalIssuer"),
]


def refusing_rules(template: dict, params: dict) -> list[str]:
    """The rules whose assertions fail for `params`, as CloudFormation checks
    them before it creates or changes anything."""
    values = _parameter_values(template, params)
    refused = []
    for name, rule in template.get("Rules", {}).items():
        applies = "RuleCondition" not in rule or _condition(rule["RuleCondition"], values, {}, {})
        if applies and not all(_condition(a["Assert"], values, {}, {}) for a in rule["Assertions"]):
            refused.append(name)
    return refused


def check_rules() -> list[str]:
    template = load()
    problems = []
    for params, want in RULE_CASES:
        got = refusing_rules(template, params)
        if want is None and got:
            problems.append(f"{params} must deploy, but {got} refuse it")
        if want is not None and want not in got:
            problems.append(f"{params} must be refused by {want}, but the rules refusing it are {got}")
    return problems


def check_prod() -> list[str]:
    t = translate({"Stage": "prod"})
    problems = []
    for rid, res in t["Resources"].items():
        props = res.get("Properties", {})
        if "sandbox" in rid.lower():
            problems.append(f"{rid}: a sandbox resource in a prod stack")
        if res["Type"] == "AWS::ApiGatewayV2::Route" and "/sandbox/" in str(props.get("RouteKey")):
            problems.append(f"{rid}: a sandbox route in a prod stack")
        if res["Type"] == "AWS::Lambda::Function":
            env = props.get("Environment", {}).get("Variables", {})
            for switch in ("FAULT_INJECTION", "FAULT_LOST_ANSWER_RATE"):
                if switch in env:
                    problems.append(f"{rid}: {switch} in a prod function's environment")
            if "sandbox" in str(env.get("WEBHOOK_SECRET_PARAMETERS", "")):
                problems.append(f"{rid}: the webhook knows the sandbox channel in a prod stack")
            if env.get("SANDBOX_LEDGER_TABLE") not in (None, ""):
                problems.append(f"{rid}: SANDBOX_LEDGER_TABLE set in a prod stack")
    return problems


def check_routes() -> list[str]:
    problems = []
    for stage in ("prod", "dev"):
        params = {"Stage": "prod"} if stage == "prod" else LOCAL_DEV
        t = translate(params)
        routes = {r["Properties"]["RouteKey"]: r["Properties"] for r in t["Resources"].values()
                  if r["Type"] == "AWS::ApiGatewayV2::Route"}
        authorizers = {rid for rid, r in t["Resources"].items()
                       if r["Type"] == "AWS::ApiGatewayV2::Authorizer" and r["Properties"]["AuthorizerType"] == "JWT"}
        if not routes:
            problems.append(f"{stage}: no routes found")
        for key, props in sorted(routes.items()):
            auth = props.get("AuthorizationType", "NONE")
            path = key.split(" ", 1)[1]
            if path.startswith("/admin/") or path.startswith("/sandbox/"):
                want = "AWS_IAM"
            elif key == "POST /payments/{channel}/notify":
                want = "NONE"
            else:
                want = "JWT"
            if auth != want:
                problems.append(f"{stage}: {key} has AuthorizationType {auth}, expected {want}")
            if want == "JWT" and props.get("AuthorizerId", {}).get("Ref") not in authorizers:
                problems.append(f"{stage}: {key} is not behind the buyers' JWT authorizer")
    return problems


CHECKS = {"rules": check_rules, "prod": check_prod, "routes": check_routes}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help") or (argv[0] != "all" and argv[0] not in CHECKS):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return run_checks({n: CHECKS[n] for n in (CHECKS if argv[0] == "all" else [argv[0]])})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
