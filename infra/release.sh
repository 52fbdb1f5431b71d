#!/usr/bin/env bash
# The release build that goes to AWS Lambda: one `bootstrap` (functions/bootstrap)
# for every function of template.yaml, built by cargo lambda for arm64
# (Graviton, the template's Architectures) with the workspace's release
# profile. Not part of the test command: the local stack runs the host debug
# build (docs/local-dev.md#why-the-local-build-is-cargo-build-not-cargo-lambda-build).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: infra/release.sh [--arch arm64|x86_64] [--lambda-dir DIR] [--help]

  1. installs what it needs, idempotently and under the repo:
       .venv/bin/cargo-lambda (+ ziglang, the cross linker), the pin of
       infra/requirements.txt, when missing;
       the Rust standard library for the target (rustup target add)
  2. cargo lambda build --release --<arch> -p bootstrap --lambda-dir DIR
  3. prints the bootstrap's size, its zipped size (what Lambda downloads on a
     cold start) and the template's functions that run it, with the wall time

Options
  --arch        arm64 (default: template.yaml's Architectures) or x86_64
  --lambda-dir  where the bootstrap goes (default target/lambda: the CodeUri
                folder template.yaml names, target/lambda/bootstrap/)

Needs: python3 (>= 3.10, venv), cargo and rustup on PATH. A cold build takes
a while (the whole AWS SDK with fat LTO; see BENCHMARKS.md, "Cold start and memory", for a figure).
Then: sam deploy (docs/operations.md, "Deploying to production").
USAGE
}

ARCH=arm64
LAMBDA_DIR=target/lambda
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --arch) ARCH="${2:?--arch needs arm64 or x86_64}"; shift 2 ;;
    --lambda-dir) LAMBDA_DIR="${2:?--lambda-dir needs a folder}"; shift 2 ;;
    *) usage >&2; exit 2 ;;
  esac
done
case "$ARCH" in
  arm64) TRIPLE=aarch64-unknown-linux-gnu; ARCH_FLAG=--arm64 ;;
  x86_64|x86-64) TRIPLE=x86_64-unknown-linux-gnu; ARCH_FLAG=--x86-64 ;;
  *) echo "unknown --arch $ARCH (arm64 or x86_64)" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -t 1 ]]; then B=$'\033[1;36m' R=$'\033[1;31m' N=$'\033[0m'; else B='' R='' N=''; fi
say() { printf '%s[release]%s %s\n' "$B" "$N" "$*"; }
die() { printf '%s[release] %s%s\n' "$R" "$*" "$N" >&2; exit 1; }

for bin in python3 cargo rustup; do
  command -v "$bin" >/dev/null || die "'$bin' not found on PATH"
done

# ---- tools -------------------------------------------------------------------
# Only cargo-lambda (which brings ziglang) from the project's pins: the rest of
# infra/tools.sh (ministack, checkov, DynamoDB Local) is for the local stack.
if ! .venv/bin/cargo-lambda --version >/dev/null 2>&1; then
  pin="$(grep -E '^cargo-lambda==' infra/requirements.txt)" || die "no cargo-lambda pin in infra/requirements.txt"
  [[ -x .venv/bin/python ]] || { say "creating .venv"; python3 -m venv .venv; }
  say "installing $pin into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$pin"
fi
if ! rustup target list --installed | grep -qx "$TRIPLE"; then
  say "rustup target add $TRIPLE"
  rustup target add "$TRIPLE"
fi

# ---- build -------------------------------------------------------------------
# cargo lambda finds zig (the linker for the Lambda glibc) on PATH via .venv/bin.
say "cargo lambda build --release $ARCH_FLAG -p bootstrap --lambda-dir $LAMBDA_DIR"
t0=$SECONDS
PATH="$ROOT/.venv/bin:$PATH" .venv/bin/cargo-lambda lambda build --release "$ARCH_FLAG" \
  -p bootstrap --lambda-dir "$LAMBDA_DIR"
took=$((SECONDS - t0))

# ---- sizes -------------------------------------------------------------------
boot="$LAMBDA_DIR/bootstrap/bootstrap"
[[ -f "$boot" ]] || die "no $boot after the build"
.venv/bin/python - "$boot" "$ARCH" "$took" <<'PY'
import io, os, re, sys, zipfile
path, arch, took = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
    zf.write(path, "bootstrap")
with open("template.yaml") as f:
    handlers = re.findall(r"(?m)^\s+Handler:\s*([a-z0-9-]+)\s*$", f.read())
raw, zipped = os.path.getsize(path), len(buf.getvalue())
print(f"[release] {path} ({arch}): {raw / 2**20:.1f} MiB, zipped {zipped / 2**20:.1f} MiB, built in {took} s")
print(f"[release] run by {len(handlers)} functions (Handler): {', '.join(handlers)}")
PY
