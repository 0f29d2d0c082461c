#!/usr/bin/env python3
"""Dependencies point one way: a source directory may include only from directories
below it in LAYERS (docs/design.md section 10, docs/architecture.md "Components and
dependencies"). Exits 1 naming every include that points up or sideways, and any
directory the table does not place (so a new directory is placed on purpose)."""
import os
import re
import sys

# Bottom first. A directory may include from any directory earlier in this list, never
# from one later or at the same rank (entries on one line are peers that do not know
# each other).
LAYERS = [
    ["kernels/common"],
    ["kernels/cpu", "kernels/cuda"],
    # Peers: the collectives (engine/parallel) know nothing of the engine's utilities.
    ["engine/util", "engine/parallel"],
    ["engine/tokenizer"],
    ["engine/chat_template", "engine/output_parsing", "engine/grammar"],
    ["engine/model"],
    # One directory per model architecture, above the loading code it shares.
    ["engine/model/deepseek_v4"],
    # model_type -> backend loaders: knows every architecture directory.
    ["engine/architectures"],
    ["engine/runtime"],
    ["services/common/transfer"],
    ["services/common"],
    ["services/security", "services/http"],
    ["services/api"],
    ["services/worker", "services/launcher"],
    ["services/cluster"],
    ["services/kvstore"],
    ["services/openai", "services/prefill", "services/decode", "services/router"],
    ["services/bin", "cli"],
]
RANK = {d: i for i, layer in enumerate(LAYERS) for d in layer}
SOURCE_ROOTS = ("kernels", "engine", "services", "cli")
INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:kernels|engine|services|cli)/[^"]+)"')


def directory_of(path):
    parts = path.split("/")
    if parts[:3] == ["services", "common", "transfer"]:
        return "services/common/transfer"
    if parts[:3] == ["engine", "model", "deepseek_v4"]:
        return "engine/model/deepseek_v4"
    if parts[0] == "cli":
        return "cli"
    return "/".join(parts[:2])


def main(root):
    problems = []
    for top in SOURCE_ROOTS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                here = directory_of(path)
                if here not in RANK:
                    problems.append(f"{path}: directory {here} is not placed in LAYERS")
                    continue
                with open(os.path.join(root, path), errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        there = directory_of(m.group(1))
                        if there == here:
                            continue
                        if there not in RANK:
                            problems.append(f"{path}:{number}: includes {m.group(1)} from unplaced {there}")
                        elif RANK[there] >= RANK[here]:
                            problems.append(f"{path}:{number}: {here} includes {m.group(1)} ({there} is not below it)")
    for p in sorted(set(problems)):
        print(p)
    print(f"{len(set(problems))} layering problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")))
