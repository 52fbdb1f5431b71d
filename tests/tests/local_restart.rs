//! The emulator-restart workaround of `infra/local.sh restart`, checked with
//! ministack's own persistence code: ministack 1.5.33 saves each stream
//! mapping's read position but not the stream's records, so the positions are
//! rewound to 0 before it starts again
//! (docs/local-dev.md#what-ministack-does-differently-measured-with-ministack-1533).
//! The state file is written and read back by ministack's `core.persistence`
//! (`save_state` / `load_state`), so a change of its format fails here rather
//! than silently in a restart drill. Needs `.venv` (infra/tools.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs Python from the repo's venv with ministack persisting into `state_dir`.
fn python(state_dir: &Path, args: &[&str]) -> String {
    let root = root();
    let out = Command::new(root.join(".venv/bin/python"))
        .args(args)
        .env("PERSIST_STATE", "1")
        .env("STATE_DIR", state_dir)
        .current_dir(&root)
        .output()
        .expect("running .venv/bin/python (infra/tools.sh creates it)");
    assert!(
        out.status.success(),
        "python {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Saves a lambda state the way ministack does on shutdown: a stream mapping
/// at position 4230, a Kinesis mapping at 17, one function record.
const SAVE: &str = r#"
from ministack.core.persistence import save_state
from ministack.core.responses import AccountRegionScopedDict
def scoped(key, value):
    d = AccountRegionScopedDict()
    d._data[("000000000000", "us-east-1", key)] = value
    return d
save_state("lambda", {
    "functions": scoped("order-expiry-relay", {"config": {"Timeout": 30}}),
    "dynamodb_stream_positions": scoped("6c48a5ff-96e5-429a-9e62-7aad597a76eb", 4230),
    "kinesis_positions": scoped("kinesis-esm", {"shard-0": 17}),
})
"#;

/// Loads it the way ministack does on start and prints what the mappings get.
const LOAD: &str = r#"
import json
from ministack.core.persistence import load_state
state = load_state("lambda")
print(json.dumps({
    "stream": {k[2]: v for k, v in state["dynamodb_stream_positions"]._data.items()},
    "kinesis": {k[2]: v for k, v in state["kinesis_positions"]._data.items()},
    "functions": sorted(k[2] for k in state["functions"]._data),
}, sort_keys=True))
"#;

#[test]
fn a_restart_rewinds_saved_stream_positions_to_the_start_of_the_rebuilt_stream_and_keeps_the_rest() {
    let state_dir = std::env::temp_dir().join(format!("local-restart-{}", std::process::id()));
    std::fs::create_dir_all(&state_dir).unwrap();
    let saved = state_dir.join("lambda.json");

    python(&state_dir, &["-c", SAVE]);
    let before = python(&state_dir, &["-c", LOAD]);
    assert!(before.contains(r#""6c48a5ff-96e5-429a-9e62-7aad597a76eb": 4230"#), "{before}");

    let printed = python(&state_dir, &["infra/rewind_stream_positions.py", saved.to_str().unwrap()]);
    assert!(printed.contains("6c48a5ff-96e5-429a-9e62-7aad597a76eb: read position 4230 -> 0"), "{printed}");

    let after = python(&state_dir, &["-c", LOAD]);
    let expected = r#"{"functions": ["order-expiry-relay"], "kinesis": {"kinesis-esm": {"shard-0": 17}}, "stream": {"6c48a5ff-96e5-429a-9e62-7aad597a76eb": 0}}"#;
    assert_eq!(after.trim(), expected);

    // Nothing to rewind a second time, and no state file is not an error.
    let again = python(&state_dir, &["infra/rewind_stream_positions.py", saved.to_str().unwrap()]);
    assert_eq!(again, "");
    std::fs::remove_dir_all(&state_dir).unwrap();
    assert_eq!(python(&state_dir, &["infra/rewind_stream_positions.py", saved.to_str().unwrap()]), "");
}
