#!/usr/bin/env bash
# Regenerates the DeepSeek-V4 golden logits of tests/goldens/v4 from Hugging Face transformers.
#   Here (with the build):  scripts/goldens/regenerate_v4.sh make   -> .carry/goldens-v4/<name>/
#   On a machine with torch + transformers >= 5.17 (the device), from the repository root:
#                           scripts/goldens/regenerate_v4.sh run OUT_DIR
# then copy OUT_DIR/*.json and OUT_DIR/hf_tiny_v4/ into tests/goldens/v4/ and commit them.
# The checkpoints are those of tests/goldens/v4/manifest.json (config, dtype, shards, seed),
# written by `tandem make-model` with a generated tokenizer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "${1:-}" in
  make)
    tandem="${TANDEM_BIN:-$root/build/bin/tandem}"
    python3 - "$root/tests/goldens/v4/manifest.json" <<'PY' | while read -r name config dtype shards seed; do
import json, sys
for e in json.load(open(sys.argv[1])):
    print(e["name"], e["config"], e["dtype"], e["shards"], e["seed"])
PY
      "$tandem" make-model --config "$root/tests/goldens/v4/$config" --out "$root/.carry/goldens-v4/$name" \
        --dtype "$dtype" --shards "$shards" --seed "$seed" --generated-tokenizer
    done ;;
  run)
    out="${2:?usage: regenerate_v4.sh run OUT_DIR}"
    python3 "$root/scripts/device/v4_goldens.py" --checkpoints "$root/.carry/goldens-v4" --out "$out" ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
