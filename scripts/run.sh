#!/usr/bin/env bash
# The main job: installs what is missing, builds, then streams a generation from the
# built-in `tiny` model (a deterministic random-weight DeepSeek-V3-architecture model,
# generated on first use). The local cluster (router, prefill, decode, kvstore) will
# take this place once the services exist.
#   scripts/run.sh ["prompt"] [tandem generate flags...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
prompt="${1:-Tandem splits prefill and decode across replicas.}"
shift || true
exec "$build/bin/tandem" generate --local --model tiny --max-tokens 48 --seed 0 "$@" "$prompt"
