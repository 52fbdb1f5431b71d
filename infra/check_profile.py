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
  notify    the payment notification route has an HTTP API of its own (the
            buyer API does not serve it and cannot invoke the webhook), with
            its own throttle (WebhookThrottling*), access log, reserved
            concurrency and source list (WebhookSourceCidrs), and its URL is
            an output (docs/payments.md, "Notification flood capacity")

Usage: .venv/bin/python infra/check_profile.py [rules|prod|routes|notify|all]
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


NOTIFY_ROUTE = "POST /payments/{channel}/notify"


def _api_of(props: dict) -> str | None:
    api = props.get("ApiId")
    return api.get("Ref") if isinstance(api, dict) else None


def check_notify() -> list[str]:
    problems = []
    for stage in ("prod", "dev"):
        t = translate({"Stage": "prod"} if stage == "prod" else LOCAL_DEV)
        res = t["Resources"]
        of_type = lambda kind: {rid: r.get("Properties", {}) for rid, r in res.items() if r["Type"] == kind}  # noqa: E731
        apis = of_type("AWS::ApiGatewayV2::Api")
        routes = of_type("AWS::ApiGatewayV2::Route")
        stages = of_type("AWS::ApiGatewayV2::Stage")
        integrations = of_type("AWS::ApiGatewayV2::Integration")
        say = lambda msg: problems.append(f"{stage}: {msg}")  # noqa: E731

        notify_apis = {_api_of(p) for p in routes.values() if p.get("RouteKey") == NOTIFY_ROUTE}
        if len(notify_apis) != 1:
            say(f"{NOTIFY_ROUTE} must be on exactly one API, found on {sorted(map(str, notify_apis))}")
            continue
        notify_api = notify_apis.pop()
        if notify_api not in apis:
            say(f"the notify route's ApiId {notify_api} is not an API of the template")
            continue
        if "HttpApi" not in apis or notify_api == "HttpApi":
            say("the notify route must not be on the buyer API (HttpApi)")
        for rid, p in routes.items():
            if _api_of(p) == notify_api and p.get("RouteKey") != NOTIFY_ROUTE:
                say(f"{rid} ({p.get('RouteKey')}) is on the notification API, which serves the notify route only")
            if _api_of(p) != notify_api and "/payments/" in str(p.get("RouteKey")) and "notify" in str(p.get("RouteKey")):
                say(f"{rid} serves notifications on {_api_of(p)}, outside the notification API")
        for rid, p in integrations.items():
            if "PaymentWebhookFunction" in str(p.get("IntegrationUri")) and _api_of(p) != notify_api:
                say(f"{rid} integrates payment-webhook into {_api_of(p)}")

        own = [p for p in stages.values() if _api_of(p) == notify_api]
        if len(own) != 1:
            say(f"the notification API needs exactly one stage, found {len(own)}")
        else:
            st = own[0]
            throttle = st.get("DefaultRouteSettings", {})
            if throttle.get("ThrottlingRateLimit") != {"Ref": "WebhookThrottlingRateLimit"} or \
                    throttle.get("ThrottlingBurstLimit") != {"Ref": "WebhookThrottlingBurstLimit"}:
                say("the notification API's stage must throttle with WebhookThrottlingRateLimit/BurstLimit")
            log = st.get("AccessLogSettings", {}).get("DestinationArn")
            buyer_logs = [p.get("AccessLogSettings", {}).get("DestinationArn") for p in stages.values()
                          if _api_of(p) == "HttpApi"]
            if not log or log in buyer_logs:
                say("the notification API needs an access log of its own")
            if "$context.identity.sourceIp" not in str(st.get("AccessLogSettings", {}).get("Format")):
                say("the notification API's access log must record the source address")
        for rid, p in stages.items():
            if _api_of(p) != notify_api and NOTIFY_ROUTE in p.get("RouteSettings", {}):
                say(f"{rid} still throttles {NOTIFY_ROUTE}, which its API does not serve")

        perms = [p for p in of_type("AWS::Lambda::Permission").values()
                 if p.get("FunctionName") == {"Ref": "PaymentWebhookFunction"}]
        if len(perms) != 1 or f"${{{notify_api}}}" not in str(perms[0].get("SourceArn")):
            say("payment-webhook may be invoked by the notification API only (one permission, its SourceArn)")
        fn = res.get("PaymentWebhookFunction", {}).get("Properties", {})
        if fn.get("ReservedConcurrentExecutions") != {"Ref": "WebhookReservedConcurrency"}:
            say("payment-webhook must have its own reserved concurrency (WebhookReservedConcurrency)")
        env = fn.get("Environment", {}).get("Variables", {})
        if env.get("WEBHOOK_SOURCE_CIDRS") != {"Ref": "WebhookSourceCidrs"}:
            say("payment-webhook must read its source list from WebhookSourceCidrs (WEBHOOK_SOURCE_CIDRS)")
        if stage == "dev":
            url = res.get("SandboxChannelFunction", {}).get("Properties", {}).get("Environment", {}) \
                .get("Variables", {}).get("WEBHOOK_URL")
            if notify_api not in str(url) or "HttpApi" in str(url):
                say(f"the sandbox channel must post to the notification API, not {url}")
        outputs = t.get("Outputs", {})
        for name in ("NotifyApiBaseUrl", "EffectiveNotifyApiBaseUrl", "NotifyApiId"):
            if notify_api not in str(outputs.get(name, {}).get("Value")):
                say(f"output {name} must name the notification API")
    return problems


CHECKS = {"rules": check_rules, "prod": check_prod, "routes": check_routes, "notify": check_notify}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help") or (argv[0] != "all" and argv[0] not in CHECKS):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return run_checks({n: CHECKS[n] for n in (CHECKS if argv[0] == "all" else [argv[0]])})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
