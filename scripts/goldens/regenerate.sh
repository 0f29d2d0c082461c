#!/usr/bin/env bash
# Regenerates the golden logits of tests/goldens from Hugging Face transformers.
#   Here (with the build):  scripts/goldens/regenerate.sh make   -> .carry/goldens/<name>/
#   On a machine with torch + transformers (the device), from the repository root:
#                           scripts/goldens/regenerate.sh run OUT_DIR
# then copy OUT_DIR/* into tests/goldens/ and commit them with this script.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "${1:-}" in
  make)
    tandem="${TANDEM_BIN:-$root/build/bin/tandem}"
    for cfg in "$root"/tests/goldens/configs/*.json; do
      name="$(basename "$cfg" .json)"
      "$tandem" make-model --config "$cfg" --out "$root/.carry/goldens/$name" --generated-tokenizer --seed 7
    done ;;
  run)
    out="${2:?usage: regenerate.sh run OUT_DIR}"
    python3 "$root/scripts/goldens/make_goldens.py" --checkpoints "$root/.carry/goldens" --out "$out" ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
