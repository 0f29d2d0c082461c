#!/usr/bin/python3
"""Turns a Tandem ready file into Prometheus file_sd targets.

  targets_from_ready_file.py READY_JSON [-o TARGETS_JSON] [--cluster NAME]

READY_JSON is what `tandem serve-local --ready-file` writes ({"processes": [{"name",
"role", "admin", ...}, ...]}), or one service's own ready file (`--ready-file` of
tandem-router / tandem-prefill / tandem-decode: {"role", "admin", ...}); several may be
given. The output is a file_sd list with one target group per process: the admin address
as target, and labels `role`, `process` and (with --cluster) `cluster`. Written atomically
(temporary file, then rename), so Prometheus never reads half a file. Standard library
only.
"""

import argparse
import json
import os
import sys
import tempfile


def processes_of(ready):
    """The processes a ready file describes: serve-local's list, or one service."""
    if isinstance(ready, dict) and isinstance(ready.get("processes"), list):
        return ready["processes"]
    if isinstance(ready, dict) and "admin" in ready:
        return [ready]
    raise ValueError("neither a serve-local ready file (no 'processes' list) nor a service's (no 'admin')")


def target_groups(ready_files, cluster=None):
    groups = []
    for path in ready_files:
        with open(path, encoding="utf-8") as f:
            ready = json.load(f)
        for i, p in enumerate(processes_of(ready)):
            admin = p.get("admin")
            if not admin:
                raise ValueError(f"{path}: process {i} has no admin address")
            role = p.get("role", "unknown")
            labels = {"role": role, "process": p.get("name", role)}
            if cluster:
                labels["cluster"] = cluster
            groups.append({"targets": [admin], "labels": labels})
    return groups


def write_atomically(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".targets-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ready_files", nargs="+", metavar="READY_JSON")
    parser.add_argument("-o", "--output", help="write here (default: stdout)")
    parser.add_argument("--cluster", help="add a cluster=NAME label to every target")
    args = parser.parse_args(argv)
    try:
        groups = target_groups(args.ready_files, args.cluster)
    except (OSError, ValueError) as e:
        print(f"targets_from_ready_file: {e}", file=sys.stderr)
        return 1
    text = json.dumps(groups, indent=2) + "\n"
    if args.output:
        write_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
