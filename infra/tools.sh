#!/usr/bin/env bash
# Installs the project's tooling under the repo (nothing global):
#   .venv/                  Python venv from infra/requirements.txt (pinned)
#   .venv-checkov/          checkov, from infra/requirements-checkov.txt (pinned)
#   .venv-localstripe/      localstripe (the Stripe test server), from
#                           infra/requirements-localstripe.txt (pinned)
#   .tools/dynamodb-local/  DynamoDB Local (AWS's engine) from the npm package
#                           amplify-dynamodb-simulator, unpacked
# Idempotent: a stamp file records what is installed; a second run is a no-op.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: infra/tools.sh [--help]

Creates/updates .venv (ministack, aws-sam-translator, boto3, cfn-lint,
cargo-lambda; pinned in infra/requirements.txt), .venv-checkov (checkov,
pinned in infra/requirements-checkov.txt) and .venv-localstripe (localstripe,
pinned in infra/requirements-localstripe.txt), and unpacks DynamoDB Local into
.tools/dynamodb-local/. Safe to run repeatedly.

Env: PYTHON (default python3), DDB_SIMULATOR_VERSION (default 2.9.30)
Needs: python3 (>= 3.10) with venv, npm, java (for DynamoDB Local), cargo.
USAGE
}
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { usage; exit 0; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DDB_SIMULATOR_VERSION="${DDB_SIMULATOR_VERSION:-2.9.30}"
if [[ -t 1 ]]; then B=$'\033[1;34m' R=$'\033[1;31m' N=$'\033[0m'; else B='' R='' N=''; fi
say() { printf '%s[tools]%s %s\n' "$B" "$N" "$*"; }
die() { printf '%s[tools] %s%s\n' "$R" "$*" "$N" >&2; exit 1; }

for bin in "$PYTHON" npm java cargo; do
  command -v "$bin" >/dev/null || die "'$bin' not found on PATH"
done

# ---- Python venv -----------------------------------------------------------
REQ="infra/requirements.txt"
want="$(sha256sum "$REQ" | cut -c1-16)"
stamp=".venv/.tools-stamp"
if [[ -x .venv/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  say ".venv up to date"
else
  t0=$SECONDS
  [[ -x .venv/bin/python ]] || { say "creating .venv"; "$PYTHON" -m venv .venv; }
  say "installing $(grep -vc '^#' "$REQ") pinned packages into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQ"
  echo "$want" > "$stamp"
  say ".venv ready in $((SECONDS - t0))s"
fi

# ---- checkov --------------------------------------------------------------
# A venv of its own: checkov pins boto3 to a version that conflicts with the
# boto3 pin of infra/requirements.txt.
REQ_CK="infra/requirements-checkov.txt"
want="$(sha256sum "$REQ_CK" | cut -c1-16)"
stamp=".venv-checkov/.tools-stamp"
if [[ -x .venv-checkov/bin/checkov && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  say ".venv-checkov up to date"
else
  t0=$SECONDS
  [[ -x .venv-checkov/bin/python ]] || { say "creating .venv-checkov"; "$PYTHON" -m venv .venv-checkov; }
  say "installing checkov into .venv-checkov"
  .venv-checkov/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQ_CK"
  echo "$want" > "$stamp"
  say ".venv-checkov ready in $((SECONDS - t0))s"
fi

# ---- localstripe ------------------------------------------------------------
# Its own venv: localstripe pins aiohttp, which ministack's venv must not get.
REQ_LS="infra/requirements-localstripe.txt"
want="$(sha256sum "$REQ_LS" | cut -c1-16)"
stamp=".venv-localstripe/.tools-stamp"
if [[ -x .venv-localstripe/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  say ".venv-localstripe up to date"
else
  t0=$SECONDS
  [[ -x .venv-localstripe/bin/python ]] || { say "creating .venv-localstripe"; "$PYTHON" -m venv .venv-localstripe; }
  say "installing localstripe into .venv-localstripe"
  .venv-localstripe/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQ_LS"
  echo "$want" > "$stamp"
  say ".venv-localstripe ready in $((SECONDS - t0))s"
fi

# ---- DynamoDB Local ----------------------------------------------------------
DDB_DIR=".tools/dynamodb-local"
if [[ -f "$DDB_DIR/DynamoDBLocal.jar" && -f "$DDB_DIR/.version" && "$(cat "$DDB_DIR/.version")" == "$DDB_SIMULATOR_VERSION" ]]; then
  say "DynamoDB Local up to date ($DDB_DIR)"
else
  t0=$SECONDS
  mkdir -p .tools
  tgz=".tools/amplify-dynamodb-simulator-${DDB_SIMULATOR_VERSION}.tgz"
  if [[ ! -s "$tgz" ]]; then
    say "fetching amplify-dynamodb-simulator@${DDB_SIMULATOR_VERSION} (npm pack, ~56 MB)"
    npm_config_cache="$ROOT/.tools/npm-cache" npm pack --silent \
      "amplify-dynamodb-simulator@${DDB_SIMULATOR_VERSION}" --pack-destination .tools >/dev/null
  fi
  rm -rf "$DDB_DIR" .tools/unpack && mkdir -p .tools/unpack
  tar -xzf "$tgz" -C .tools/unpack package/emulator
  mv .tools/unpack/package/emulator "$DDB_DIR"
  rm -rf .tools/unpack .tools/npm-cache
  echo "$DDB_SIMULATOR_VERSION" > "$DDB_DIR/.version"
  say "DynamoDB Local unpacked into $DDB_DIR in $((SECONDS - t0))s"
fi
