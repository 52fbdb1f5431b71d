"""Rewind the DynamoDB-stream read positions ministack saved, before it starts again.

Usage: rewind_stream_positions.py <STATE_DIR>/lambda.json

ministack 1.5.33 with PERSIST_STATE=1 saves each stream mapping's read position
(an absolute index into the table's stream) in lambda.json, but does not save
the streams' records: after a restart every table's stream starts again, empty,
at index 0. A mapping restored at index N reads nothing until the new stream is
N records long and never reads those N records. Setting every saved position to
0, the start of the stream the emulator rebuilds, makes the mapping read every
record written after the restart. Kinesis positions are left alone (Kinesis
keeps its records). Prints one line per rewound mapping.
"""

import json
import os
import sys


def rewind(state: dict) -> dict:
    """Sets every saved DynamoDB-stream position to 0; returns {key: old position} of those moved."""
    positions = (state.get("payload") or {}).get("dynamodb_stream_positions") or {}
    # ministack writes its account/region-scoped dicts as {"__account_region_scoped__": true, "data": {...}}.
    scoped = positions.get("data", {}) if positions.get("__account_region_scoped__") else positions
    moved = {key: old for key, old in scoped.items() if isinstance(old, int) and old != 0}
    for key in moved:
        scoped[key] = 0
    return moved


def main(path: str) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        state = json.load(f)
    moved = rewind(state)
    if not moved:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)
    for key, old in moved.items():
        mapping = key.split("\x00")[-1].strip("'")
        print(f"[local] stream mapping {mapping}: read position {old} -> 0 (the emulator keeps no stream records)")


if __name__ == "__main__":
    main(sys.argv[1])
