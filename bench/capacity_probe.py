"""How DynamoDB Local counts consumed capacity, call by call (BENCHMARKS.md,
"Does DynamoDB Local count like AWS?"). Creates a throw-away table with a
KEYS_ONLY GSI on $DYNAMODB_LOCAL_ENDPOINT, prints what each call reports
with ReturnConsumedCapacity, and deletes the table.

    DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8005 .venv/bin/python bench/capacity_probe.py
"""

import os
import uuid

import boto3

c = boto3.client(
    "dynamodb",
    endpoint_url=os.environ["DYNAMODB_LOCAL_ENDPOINT"],
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
t = f"capacity-probe-{uuid.uuid4().hex[:8]}"
c.create_table(
    TableName=t,
    BillingMode="PAY_PER_REQUEST",
    AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ["pk", "sk", "g", "r"]],
    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    GlobalSecondaryIndexes=[
        {
            "IndexName": "gix",
            "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}, {"AttributeName": "r", "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ],
)


def item(**kw):
    return {k: {"S": v} for k, v in kw.items()}


def transact(items, mode="INDEXES"):
    r = c.transact_write_items(
        TransactItems=[{"Put": {"TableName": t, "Item": i}} for i in items], ReturnConsumedCapacity=mode
    )
    return r["ConsumedCapacity"]


try:
    print("TransactWriteItems, 1 item:", transact([item(pk="a1", sk="x")]))
    print("TransactWriteItems, 1 item in the GSI:", transact([item(pk="a2", sk="x", g="g", r="1")]))
    print("TransactWriteItems, 2 items:", transact([item(pk="a3", sk="x"), item(pk="a4", sk="x")]))
    six = [item(pk=f"b{i}", sk="x", **({"g": "g", "r": "2"} if i == 0 else {})) for i in range(6)]
    print("TransactWriteItems, 6 items, one in the GSI:", transact(six))
    print("TransactWriteItems, 6 items, TOTAL:", transact([item(pk=f"c{i}", sk="x") for i in range(6)], "TOTAL"))
    print("TransactWriteItems, 1 item of 1.5 KB:", transact([item(pk="d", sk="x", v="x" * 1500)]))
    put = c.put_item(TableName=t, Item=item(pk="e", sk="x", g="g", r="3"), ReturnConsumedCapacity="INDEXES")
    print("PutItem, item enters the GSI:", put["ConsumedCapacity"])
    upd = c.update_item(
        TableName=t,
        Key=item(pk="e", sk="x"),
        UpdateExpression="SET g = :g",
        ExpressionAttributeValues={":g": {"S": "h"}},
        ReturnConsumedCapacity="INDEXES",
    )
    print("UpdateItem moving the GSI key:", upd["ConsumedCapacity"])
    q = c.query(
        TableName=t,
        IndexName="gix",
        KeyConditionExpression="g = :g",
        ExpressionAttributeValues={":g": {"S": "none"}},
        ReturnConsumedCapacity="INDEXES",
    )
    print("Query on the GSI, nothing found:", q["ConsumedCapacity"])
    for consistent in (True, False):
        g = c.get_item(
            TableName=t, Key=item(pk="e", sk="x"), ConsistentRead=consistent, ReturnConsumedCapacity="INDEXES"
        )
        print(f"GetItem, ConsistentRead={consistent}:", g["ConsumedCapacity"])
finally:
    c.delete_table(TableName=t)
