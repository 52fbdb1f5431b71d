"""What DynamoDB Local does with concurrent transactions on one item
(BENCHMARKS.md#measured-locally-dynamodb-local). Creates a throw-away table on
$DYNAMODB_LOCAL_ENDPOINT with one stock item, then, for 1, 8 and 32 threads
(one client each, SDK retries off so every cancellation is seen), has each
thread commit TRANSACTIONS two-item transactions shaped like the create's
stock decrement (a new order item + `available -= 1` on the shared item),
and prints per level: committed, refused by cause (with the cancellation
reason codes), transactions per second, and the most transactions that were
in flight at once. On AWS, overlapping transactions on one item cancel each
other with TransactionConflict; the probe shows whether the engine under
test does. Deletes the table.

    DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8003 .venv/bin/python bench/hot_item_probe.py
"""

import os
import threading
import time
import uuid

import boto3
import botocore.exceptions
from botocore.config import Config

TRANSACTIONS = 15
CONFIG = Config(retries={"max_attempts": 1}, max_pool_connections=64)


def client():
    return boto3.client(
        "dynamodb",
        endpoint_url=os.environ["DYNAMODB_LOCAL_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=CONFIG,
    )


def create(c, table: str) -> None:
    order = f"ORDER#{uuid.uuid4()}"
    c.transact_write_items(
        TransactItems=[
            {
                "Put": {
                    "TableName": table,
                    "Item": {"pk": {"S": order}, "sk": {"S": "ORDER"}},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
            {
                "Update": {
                    "TableName": table,
                    "Key": {"pk": {"S": "SKU#HOT"}, "sk": {"S": "STOCK"}},
                    "UpdateExpression": "SET available = available - :q, reserved = reserved + :q",
                    "ConditionExpression": "available >= :q",
                    "ExpressionAttributeValues": {":q": {"N": "1"}},
                }
            },
        ]
    )


def level(table: str, threads: int) -> None:
    lock = threading.Lock()
    committed, refused, in_flight, most = [0], {}, [0], [0]

    def worker(c) -> None:
        for _ in range(TRANSACTIONS):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            why = None
            try:
                create(c, table)
            except botocore.exceptions.ClientError as e:
                reasons = ",".join(r.get("Code", "") for r in e.response.get("CancellationReasons", []))
                why = f"{e.response['Error']['Code']}[{reasons}]"
            with lock:
                in_flight[0] -= 1
                if why:
                    refused[why] = refused.get(why, 0) + 1
                else:
                    committed[0] += 1

    clients = [client() for _ in range(threads)]
    start = time.time()
    workers = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.time() - start
    print(
        f"threads {threads}: committed {committed[0]} of {threads * TRANSACTIONS}, refused {refused or 0}, "
        f"{committed[0] / took:.0f} transactions/s, at most {most[0]} in flight"
    )


def main() -> None:
    c = client()
    table = f"hot-item-probe-{uuid.uuid4().hex[:8]}"
    c.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ["pk", "sk"]],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    )
    try:
        c.put_item(
            TableName=table,
            Item={"pk": {"S": "SKU#HOT"}, "sk": {"S": "STOCK"}, "available": {"N": "1000000"}, "reserved": {"N": "0"}},
        )
        for threads in (1, 8, 32):
            level(table, threads)
        stock = c.get_item(TableName=table, Key={"pk": {"S": "SKU#HOT"}, "sk": {"S": "STOCK"}}, ConsistentRead=True)
        print(f"stock item after: reserved {stock['Item']['reserved']['N']}")
    finally:
        c.delete_table(TableName=table)


if __name__ == "__main__":
    main()
