#!/usr/bin/env python3
"""DeepSeek-V4 greedy references from Hugging Face transformers in bf16 on the GPU.

The closeness check of issue 22 (the one vLLM uses against transformers): wherever the
engine's greedy output and transformers' part, each one's token must be among the other's
five most likely there. This writes transformers' side: for each checkpoint of
tests/goldens/v4/manifest.json (made by `scripts/goldens/regenerate_v4.sh make`, travelling
in .carry/goldens-v4) and for tests/goldens/v4/hf_tiny_v4 (written by transformers itself),
the model in bfloat16 on the GPU (eager attention), 10 prompts, 32 greedy tokens each
through transformers' cache, and the five most likely ids at every step; then the same
model in float32 on the GPU over the same prompts, and how often transformers' own float32
and bfloat16 outputs pass the check against each other. Run on the device
from the repository root:

    python3 scripts/device/v4_bf16_reference.py --checkpoints .carry/goldens-v4 --out OUT

and commit OUT/*.json as tests/goldens/v4/bf16_gpu/; the C++ GPU test
tests/unit/engine/model/deepseek_v4/cuda_v4_transformers_test.cc reads them (and skips
until they are there). Loading is v4_goldens.py's (transformers' from_pretrained, or that
script's own decoding of the files if transformers cannot load one).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_goldens as goldens  # noqa: E402  (same directory)


def load(path):
    """The checkpoint's model in float32 on the CPU (cast and moved by the caller)."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    quantized = "quantization_config" in config
    try:
        model, loader = goldens.transformers_model(path, quantized), "transformers from_pretrained"
    except Exception as e:  # noqa: BLE001 -- recorded, then the files are decoded here
        print(f"{path}: transformers could not load it ({type(e).__name__}: {e}); decoding the files here",
              file=sys.stderr)
        model, loader = goldens.manual_model(path), "v4_goldens.py's own decoding"
    return config, model, loader


def closeness(a_ids, a_top, b_ids, b_top):
    """None where a and b agree on every token; else (step, passed) at the first parting."""
    for step, (a, b) in enumerate(zip(a_ids, b_ids)):
        if a != b:
            return step, a in b_top[step] and b in a_top[step]
    return None


def greedy(model, prompt, tokens, top):
    ids = torch.tensor([prompt], dtype=torch.long, device="cuda")
    out_ids, out_top = [], []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        for _ in range(tokens):
            best = torch.topk(logits, top)
            out_top.append([int(i) for i in best.indices.tolist()])
            token = int(torch.argmax(logits))
            out_ids.append(token)
            out = model(input_ids=torch.tensor([[token]], device="cuda"), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
    return out_ids, out_top


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--checkpoints", required=True, help="directory of checkpoints, one per manifest entry")
    p.add_argument("--manifest", default=os.path.join(root, "tests/goldens/v4/manifest.json"))
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--seed", type=int, default=2026)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(args.manifest) as f:
        cases = [(e["name"], os.path.join(args.checkpoints, e["name"]), e) for e in json.load(f)]
    cases.append(("hf_tiny_v4", os.path.join(root, "tests/goldens/v4/hf_tiny_v4"), None))
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 products
    for name, path, entry in cases:
        config, model, loader = load(path)
        bf16 = model.to(dtype=torch.bfloat16, device="cuda").eval()
        rng = np.random.default_rng(args.seed)
        prompts = []
        for i in range(args.prompts):
            prompt = [0] + rng.integers(3, config["vocab_size"], size=11 + 9 * i).tolist()
            ids, top = greedy(bf16, prompt, args.tokens, args.top)
            prompts.append({"prompt_ids": prompt, "greedy_ids": ids, "top_ids": top})
        del bf16
        # The same model in float32 on the GPU: how far bf16 alone moves transformers' own
        # output (random tiny weights give flat logits and many discrete choices: routing,
        # the indexer's top-k), which bounds what the closeness check can ask of an engine.
        _, model, _ = load(path)
        f32 = model.to(dtype=torch.float32, device="cuda").eval()
        bounds = {"identical": 0, "parted_within_top": 0, "parted_outside_top": []}
        for i, pr in enumerate(prompts):
            ids, top = greedy(f32, pr["prompt_ids"], args.tokens, args.top)
            pr["f32_greedy_ids"], pr["f32_top_ids"] = ids, top
            c = closeness(ids, top, pr["greedy_ids"], pr["top_ids"])
            if c is None:
                bounds["identical"] += 1
            elif c[1]:
                bounds["parted_within_top"] += 1
            else:
                bounds["parted_outside_top"].append(i)
        del f32
        print(f"{name}: transformers float32 vs bfloat16 on the GPU: {bounds}")
        meta = {"name": name, "dtype": "bfloat16", "device": torch.cuda.get_device_name(0), "loader": loader,
                "transformers": goldens.transformers.__version__, "torch": torch.__version__,
                "top": args.top, "f32_vs_bf16": bounds, "prompts": prompts}
        if entry is not None:
            meta["manifest"] = entry
            meta["checkpoint_xxh64"] = goldens.checkpoint_hash(path)
        out = os.path.join(args.out, f"{name}.json")
        with open(out, "w") as f:
            json.dump(meta, f)
            f.write("\n")
        print(f"{name}: {len(prompts)} prompts x {args.tokens} tokens ({loader}), {os.path.getsize(out) // 1024} KiB")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
