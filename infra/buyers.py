"""Buyer accounts on the local stack's Cognito user pool, for scripts.

The API takes the buyer from a verified access token (issue 8): a script
that acts for a buyer signs one up (admin-created, confirmed, fixed dev
password), signs in with USER_PASSWORD_AUTH (enabled on the app client only
when Stage is dev) and sends `Authorization: Bearer <access token>`.

    from buyers import Buyers
    b = Buyers()                     # reads BUYER_USER_POOL_ID / _CLIENT_ID from the env
    token, user_id = b.sign_in("alice")

`user_id` is what the orders of that buyer carry: the token's subject.
Run with .local/stack.env exported (AWS_ENDPOINT_URL, credentials, ids).
"""
from __future__ import annotations

import base64
import json
import os

import boto3

# Dev only: the local pool's buyers are test accounts. Meets the pool's
# password policy (12+, upper, lower, digit).
DEV_PASSWORD = os.environ.get("LOCAL_BUYER_PASSWORD", "Local-buyer-Pa55word")


def token_claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


class Buyers:
    def __init__(self, pool_id: str | None = None, client_id: str | None = None):
        self.pool_id = pool_id or os.environ["BUYER_USER_POOL_ID"]
        self.client_id = client_id or os.environ["BUYER_USER_POOL_CLIENT_ID"]
        self.idp = boto3.client("cognito-idp")
        self._cache: dict[str, tuple[str, str]] = {}

    def sign_in(self, name: str) -> tuple[str, str]:
        """(access token, user id) of buyer `name`, created on first use."""
        if name in self._cache:
            return self._cache[name]
        try:
            self.idp.admin_create_user(
                UserPoolId=self.pool_id, Username=name, MessageAction="SUPPRESS",
                UserAttributes=[{"Name": "email", "Value": f"{name}@example.com"},
                                {"Name": "email_verified", "Value": "true"}],
            )
        except self.idp.exceptions.UsernameExistsException:
            pass  # made earlier or by a concurrent process
        # Always set it: a concurrent creator may not have set it yet, and
        # setting the same permanent password twice ends the same.
        self.idp.admin_set_user_password(
            UserPoolId=self.pool_id, Username=name, Password=DEV_PASSWORD, Permanent=True)
        out = self.idp.initiate_auth(
            ClientId=self.client_id, AuthFlow="USER_PASSWORD_AUTH",
            AuthParameters={"USERNAME": name, "PASSWORD": DEV_PASSWORD})
        token = out["AuthenticationResult"]["AccessToken"]
        user_id = token_claims(token)["sub"]
        self._cache[name] = (token, user_id)
        return token, user_id


def load_stack_env(path: str) -> None:
    """The local stack's settings (.local/stack.env), without overriding the environment."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                os.environ.setdefault(k, v)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: .venv/bin/python infra/buyers.py NAME\n"
              "prints NAME's access token and user id as ACCESS_TOKEN=… and USER_ID=… lines\n"
              "(creating the buyer on first use); reads .local/stack.env unless the\n"
              "environment already names the pool (BUYER_USER_POOL_ID, BUYER_USER_POOL_CLIENT_ID)")
        sys.exit(0 if len(sys.argv) == 2 else 2)
    if "BUYER_USER_POOL_ID" not in os.environ:
        env_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".local", "stack.env")
        if not os.path.exists(env_file):
            sys.exit("no .local/stack.env: start the local stack first (infra/local.sh up)")
        load_stack_env(env_file)
    tok, uid = Buyers().sign_in(sys.argv[1])
    print(f"ACCESS_TOKEN={tok}\nUSER_ID={uid}")
