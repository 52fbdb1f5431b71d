"""The reference a user would otherwise pick: a Python boto3 Lambda handler
that creates the same clients as the Rust function it stands beside.

Run by bench/bench_cold_start.py under the same fake Runtime API as the
bootstrap, with the same environment. The runtime loop is the minimal one of
the Lambda Runtime API (GET next, POST response or error), written with the
standard library the way awslambdaric's loop does it, so the figure is boto3's
and the interpreter's, not a runtime client's:

  BENCH_CLIENTS  the boto3 services to create at init (the SDK clients the
                 Rust function builds, e.g. "dynamodb,sqs")
  WEBHOOK_SECRET_PARAMETER(S)  read from SSM at init, like the Rust webhook
                 and sandbox functions do

The handler makes one call on its first client (its error is expected from
the fake endpoint and caught), as the Rust handler's first event makes one.
"""
import json
import os
import urllib.request

import boto3

SERVICES = [s for s in os.environ["BENCH_CLIENTS"].split(",") if s]
CLIENTS = {service: boto3.client(service) for service in SERVICES}

# The secrets the webhook (per channel) and the sandbox read once per cold start.
SECRETS = {}
for pair in filter(None, os.environ.get("WEBHOOK_SECRET_PARAMETERS", "").split(",")):
    channel, name = pair.split("=", 1)
    SECRETS[channel] = CLIENTS["ssm"].get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
if os.environ.get("WEBHOOK_SECRET_PARAMETER"):
    name = os.environ["WEBHOOK_SECRET_PARAMETER"]
    SECRETS[""] = CLIENTS["ssm"].get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]

FIRST_CALL = {
    "dynamodb": lambda c: c.get_item(TableName=os.environ["TABLE_NAME"], Key={"pk": {"S": "ORDER#x"}, "sk": {"S": "ORDER"}}),
    "sqs": lambda c: c.send_message(QueueUrl="http://127.0.0.1/000000000000/q", MessageBody="{}"),
    "events": lambda c: c.put_events(Entries=[{"Source": "bench", "DetailType": "x", "Detail": "{}"}]),
    "scheduler": lambda c: c.delete_schedule(Name="order-x"),
    "ssm": lambda c: c.get_parameter(Name="/bench"),
}


def handler(event, context):
    service = next((s for s in SERVICES if s != "ssm"), SERVICES[0])
    try:
        FIRST_CALL[service](CLIENTS[service])
    except Exception as err:  # the fake endpoint refuses every call but SSM reads
        return {"statusCode": 500, "body": type(err).__name__}
    return {"statusCode": 200}


def main():
    api = f"http://{os.environ['AWS_LAMBDA_RUNTIME_API']}/2018-06-01/runtime/invocation"
    while True:
        with urllib.request.urlopen(f"{api}/next") as r:
            request_id = r.headers["Lambda-Runtime-Aws-Request-Id"]
            event = json.loads(r.read())
        body = json.dumps(handler(event, None)).encode()
        urllib.request.urlopen(urllib.request.Request(f"{api}/{request_id}/response", data=body, method="POST")).read()


if __name__ == "__main__":
    main()
