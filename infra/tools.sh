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

# ---- Python venvs -----------------------------------------------------------
# venv DIR REQUIREMENTS CHECK_BIN: DIR holds REQUIREMENTS (pinned), installed
# again only when the file changes (its hash is DIR's stamp) or CHECK_BIN
# (a program the venv must have) is missing.
venv() {
  local dir="$1" req="$2" check="$3" want stamp t0
  want="$(sha256sum "$req" | cut -c1-16)"
  stamp="$dir/.tools-stamp"
  if [[ -x "$dir/bin/$check" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "$dir up to date"
    return 0
  fi
  t0=$SECONDS
  [[ -x "$dir/bin/python" ]] || { say "creating $dir"; "$PYTHON" -m venv "$dir"; }
  say "installing $(grep -cv '^\s*#' "$req") pinned packages of $req into $dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
  say "$dir ready in $((SECONDS - t0))s"
}

venv .venv infra/requirements.txt python
# Venvs of their own: checkov pins boto3 to a version that conflicts with
# the boto3 pin of infra/requirements.txt, and localstripe pins aiohttp,
# which ministack's venv must not get.
venv .venv-checkov infra/requirements-checkov.txt checkov
venv .venv-localstripe infra/requirements-localstripe.txt python

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
