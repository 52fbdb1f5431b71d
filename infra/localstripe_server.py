#!/usr/bin/env python3
"""Runs localstripe (PyPI, a stateful fake Stripe server by a third party)
the way the local stack and the tests need it, without changing its code:

  - bound to 127.0.0.1 only (its own `localstripe` command listens on every
    interface and has no option for it);
  - state in memory only: localstripe pickles its whole store to
    /tmp/localstripe.pickle after every write (and loads it at start), which
    grows with every object (quadratic over a load run) and writes outside
    the repository. Here, like DynamoDB Local's -inMemory, a restart starts
    empty.

Usage: .venv-localstripe/bin/python infra/localstripe_server.py [--port 8420]
"""
import argparse
import logging

from aiohttp import web
from localstripe import resources, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8420)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args()
    resources.Store.dump_to_disk = lambda self: None
    resources.Store.try_load_from_disk = lambda self: None
    logger = logging.getLogger("aiohttp.access")
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    web.run_app(server.app, host=args.host, port=args.port, access_log=logger, print=None)


if __name__ == "__main__":
    main()
