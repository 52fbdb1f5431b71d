#!/usr/bin/env bash
# The project's test command (README command 2, and what CI runs via .ci/run).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: infra/test.sh [--help]

  1. infra/tools.sh                  .venv + DynamoDB Local under .tools/
  2. infra/local.sh build            cargo build --workspace --bins (debug)
  3. cfn-lint template.yaml, checkov (template.yaml with its loops expanded,
     and its dev/prod translations; skips in .checkov.yaml), cargo fmt --check and
     cargo clippy -D warnings (when rustfmt and clippy are installed)
  4. DynamoDB Local on 127.0.0.1:8000 (in-memory)
  5. the tests that write 10,000 orders (-E 'test(ten_thousand)'), one at a
     time, each on a fresh DynamoDB Local of its own on 127.0.0.1:8010,
     before the stack is up (skipped when NEXTEST_ARGS is set)
  6. infra/local.sh up               ministack + the stack (short payment window)
  7. cargo nextest run --workspace --no-fail-fast with .local/stack.env exported,
     DYNAMODB_LOCAL_ENDPOINT=http://127.0.0.1:8000, AWS_ENDPOINT_URL, AWS_REGION
     and dummy credentials: every other test (every test matching NEXTEST_ARGS
     when it is set)
  8. always: infra/local.sh down

Environment (defaults in brackets)
  PAYMENT_WINDOW_SECONDS [20]   DYNAMODB_LOCAL_PORT [8000]
  DYNAMODB_LOCAL_BIG_PORT [DYNAMODB_LOCAL_PORT + 10]   the 10,000-order tests' emulator
  NEXTEST_ARGS [""]             extra arguments for cargo nextest run (e.g. a filter)
  NEXTEST_NO_TESTS [fail]       nextest --no-tests action (fail|warn|pass)
  KEEP_STACK=1                  do not tear down at the end (debugging)
Exit status: non-zero if any step or any test fails.
USAGE
}
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { usage; exit 0; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PAYMENT_WINDOW_SECONDS="${PAYMENT_WINDOW_SECONDS:-20}"
DDB_PORT="${DYNAMODB_LOCAL_PORT:-8000}"
# The emulator each 10,000-order test gets to itself.
BIG_PORT="${DYNAMODB_LOCAL_BIG_PORT:-$((DDB_PORT + 10))}"
STATE="$ROOT/.local"
if [[ -t 1 ]]; then B=$'\033[1;35m' R=$'\033[1;31m' G=$'\033[1;32m' N=$'\033[0m'; else B='' R='' G='' N=''; fi
say() { printf '%s[test]%s %s\n' "$B" "$N" "$*"; }
die() { printf '%s[test] %s%s\n' "$R" "$*" "$N" >&2; exit 1; }
T0=$SECONDS
step() { say "==> $*  [t+$((SECONDS - T0))s]"; }

teardown() {
  local rc=$?
  [[ -f "$STATE/dynamodb-local-big.pid" ]] && { kill "$(cat "$STATE/dynamodb-local-big.pid")" 2>/dev/null || true; }
  if [[ "${KEEP_STACK:-0}" == 1 ]]; then
    say "KEEP_STACK=1: leaving the local stack running (infra/local.sh down to stop)"
  else
    infra/local.sh down || true
  fi
  if (( rc == 0 )); then printf '%s[test] PASSED in %ss%s\n' "$G" "$((SECONDS - T0))" "$N"
  else printf '%s[test] FAILED (exit %s) after %ss%s\n' "$R" "$rc" "$((SECONDS - T0))" "$N" >&2; fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

command -v cargo-nextest >/dev/null || die "cargo-nextest not found (cargo install cargo-nextest --locked)"

step "tools"
infra/tools.sh

step "build"
infra/local.sh build

step "cfn-lint template.yaml infra/subscriber.yaml"
.venv/bin/cfn-lint template.yaml infra/subscriber.yaml
say "cfn-lint: clean"

step "checkov (skips and their reasons: .checkov.yaml)"
# template.yaml with its Fn::ForEach loops written out (checkov does not
# expand AWS::LanguageExtensions and would miss every resource a loop makes),
# and the translated templates too: the roles, mappings and queues SAM
# generates exist only there.
mkdir -p target
.venv/bin/python infra/template_check.py expand target/template-expanded.json
.venv/bin/python infra/template_check.py translate dev target/template-dev.json
.venv/bin/python infra/template_check.py translate prod target/template-prod.json
# checkov reads LOG_LEVEL as its own (a Python logging level); ours is the
# functions' RUST_LOG filter.
LOG_LEVEL=WARNING .venv-checkov/bin/checkov --config-file .checkov.yaml \
  -f target/template-expanded.json -f infra/subscriber.yaml -f target/template-dev.json -f target/template-prod.json \
  || die "checkov found issues (fix them, or skip the check in .checkov.yaml with the reason)"
say "checkov: clean"

if cargo fmt --version >/dev/null 2>&1; then
  step "cargo fmt --check"
  cargo fmt --all --check || die "code is not formatted: run cargo fmt --all"
else
  say "rustfmt not installed: formatting not checked"
fi

if cargo clippy --version >/dev/null 2>&1; then
  step "cargo clippy --workspace --all-targets -- -D warnings"
  cargo clippy --workspace --all-targets --quiet -- -D warnings \
    || die "clippy found issues (fix them; an allow needs a comment saying why)"
else
  say "clippy not installed: lints not checked"
fi

# Starts DynamoDB Local (in-memory) on port $1, its pid in $2.pid and its
# output in $2.log, and waits until it answers.
start_dynamodb_local() {
  local port=$1 base=$2
  (
    cd .tools/dynamodb-local
    exec setsid java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
      -inMemory -port "$port" >"$base.log" 2>&1 </dev/null
  ) &
  echo $! >"$base.pid"
  for i in $(seq 1 150); do
    # Any HTTP answer (DynamoDB Local says 400 to a bare GET) means it is listening.
    curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
    kill -0 "$(cat "$base.pid")" 2>/dev/null || { cat "$base.log" >&2; die "DynamoDB Local exited"; }
    (( i == 150 )) && die "DynamoDB Local did not start in 30s"
    sleep 0.2
  done
}

step "DynamoDB Local on 127.0.0.1:$DDB_PORT"
# A previous run's local stack (and its DynamoDB Local) is stopped first.
infra/local.sh down >/dev/null
mkdir -p "$STATE"
ddb_answers() {
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 \
    .venv/bin/python -c "import boto3,sys; boto3.client('dynamodb', endpoint_url=sys.argv[1]).list_tables()" \
    "http://127.0.0.1:$DDB_PORT" >/dev/null 2>&1
}
if (exec 3<>"/dev/tcp/127.0.0.1/$DDB_PORT") 2>/dev/null; then
  # Someone else's DynamoDB Local (e.g. a developer's): use it, never stop it.
  ddb_answers || die "port $DDB_PORT is in use by something that is not DynamoDB"
  say "reusing the DynamoDB Local already listening on port $DDB_PORT (not started here, will not be stopped)"
else
  start_dynamodb_local "$DDB_PORT" "$STATE/dynamodb-local"
  say "DynamoDB Local ready"
fi

export DYNAMODB_LOCAL_ENDPOINT="http://127.0.0.1:$DDB_PORT"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
unset AWS_SESSION_TOKEN AWS_PROFILE
mkdir -p target
NEXTEST_LOG="target/nextest-last.log"
: >"$NEXTEST_LOG"
rc=0
if [[ -z "${NEXTEST_ARGS:-}" ]]; then
  step "the ten_thousand tests, each on a DynamoDB Local of its own (port $BIG_PORT)"
  # The tests that write 10,000 orders run first, before the stack is up
  # (they need only DynamoDB Local), each on a fresh emulator of its own:
  # DynamoDB Local slows down for good once it has held a big table, even
  # after the table is deleted. Measured 2026-12-04: the sweep's drain
  # planted its 10,000 orders in 7 s on a fresh one and in 90 s after the
  # other two big tests (whole test 65 s against 10 minutes and a timeout).
  (exec 3<>"/dev/tcp/127.0.0.1/$BIG_PORT") 2>/dev/null \
    && die "port $BIG_PORT is in use (stop what listens there or set DYNAMODB_LOCAL_BIG_PORT)"
  set +e
  mapfile -t big_tests < <(cargo nextest list --workspace -E 'test(ten_thousand)' --message-format oneline 2>/dev/null)
  (( ${#big_tests[@]} > 0 )) || { say "no ten_thousand tests listed"; rc=1; }
  for line in "${big_tests[@]}"; do
    read -r binary name <<<"$line"
    start_dynamodb_local "$BIG_PORT" "$STATE/dynamodb-local-big"
    DYNAMODB_LOCAL_ENDPOINT="http://127.0.0.1:$BIG_PORT" \
      cargo nextest run --workspace --no-fail-fast -E "binary_id($binary) & test(=$name)" 2>&1 | tee -a "$NEXTEST_LOG"
    r=${PIPESTATUS[0]}
    (( rc == 0 )) && rc=$r
    kill "$(cat "$STATE/dynamodb-local-big.pid")" 2>/dev/null
    wait "$(cat "$STATE/dynamodb-local-big.pid")" 2>/dev/null
    rm -f "$STATE/dynamodb-local-big.pid"
  done
  set -e
fi

step "local stack (PAYMENT_WINDOW_SECONDS=$PAYMENT_WINDOW_SECONDS)"
DEMO=0 SKIP_TOOLS=1 SKIP_BUILD=1 infra/local.sh up

step "cargo nextest run --workspace --no-fail-fast"
set -a
# shellcheck disable=SC1091
. "$STATE/stack.env"
set +a
set +e
if [[ -n "${NEXTEST_ARGS:-}" ]]; then
  # shellcheck disable=SC2086
  cargo nextest run --workspace --no-fail-fast --no-tests="${NEXTEST_NO_TESTS:-fail}" ${NEXTEST_ARGS} 2>&1 | tee "$NEXTEST_LOG"
  rc=${PIPESTATUS[0]}
else
  cargo nextest run --workspace --no-fail-fast --no-tests="${NEXTEST_NO_TESTS:-fail}" -E 'not test(ten_thousand)' 2>&1 | tee -a "$NEXTEST_LOG"
  rc2=${PIPESTATUS[0]}
  (( rc == 0 )) && rc=$rc2
fi
set -e
summary="$(grep -E '^ *Summary \[' "$NEXTEST_LOG" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/^ *//' | paste -sd ';' -)"
say "tests: ${summary:-no nextest summary (see $NEXTEST_LOG)}"
step "done"
exit "$rc"
