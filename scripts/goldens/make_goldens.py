#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for Tandem's golden tests.

Run where torch and transformers are installed (the H200 machine has them):

    python3 scripts/goldens/make_goldens.py --checkpoints DIR --out tests/goldens

DIR holds one checkpoint per golden, each written by
`tandem make-model --config tests/goldens/configs/NAME.json --out DIR/NAME --generated-tokenizer`
(scripts/goldens/regenerate.sh does both steps). For each checkpoint this loads
DeepseekV2ForCausalLM / DeepseekV3ForCausalLM from the very same files in float32 with eager
attention on the CPU, and writes NAME.json (prompt, tokens, checksums) and NAME.logits.f32
(little-endian float32: the prompt's logits [prompt_len][vocab], then the logits of each
incremental decode step [decode_steps][vocab]).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
import xxhash
from transformers import AutoModelForCausalLM


def checkpoint_hash(path):
    h = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as f:
                h[name] = xxhash.xxh64(f.read(), seed=0).hexdigest()
    return h


def run_one(name, path, args):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        sys.exit(f"{name}: transformers did not load the checkpoint cleanly: {problems}")
    model.eval()
    vocab = model.config.vocab_size

    rng = np.random.default_rng(args.seed)
    prompt = [0] + rng.integers(3, vocab, size=args.prompt_len - 1).tolist()
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        prompt_logits = out.logits[0].float().numpy()
        past = out.past_key_values
        token = int(prompt_logits[-1].argmax())
        greedy, decode_inputs, decode_logits = [token], [], []
        # Incremental greedy decoding through transformers' own KV cache.
        for step in range(args.greedy_tokens - 1):
            out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float().numpy()
            if step < args.decode_steps:
                decode_inputs.append(token)
                decode_logits.append(logits)
            token = int(logits.argmax())
            greedy.append(token)

    logits = np.concatenate([prompt_logits, np.stack(decode_logits)], axis=0).astype("<f4")
    logits.tofile(os.path.join(args.out, f"{name}.logits.f32"))
    meta = {
        "name": name,
        "model_type": model.config.model_type,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "checkpoint_xxh64": checkpoint_hash(path),
        "vocab_size": vocab,
        "prompt_ids": prompt,
        "decode_input_ids": decode_inputs,
        "greedy_ids": greedy,
        "prompt_max_abs_logit": float(np.abs(prompt_logits).max()),
        "decode_max_abs_logit": float(np.abs(np.stack(decode_logits)).max()),
    }
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{name}: prompt {len(prompt)} tokens, {len(decode_inputs)} decode steps, "
          f"{len(greedy)} greedy tokens, max |logit| {meta['prompt_max_abs_logit']:.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", required=True, help="directory of checkpoints, one per golden")
    p.add_argument("--out", required=True, help="where NAME.json and NAME.logits.f32 go")
    p.add_argument("--prompt-len", type=int, default=112)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--greedy-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    for name in sorted(os.listdir(args.checkpoints)):
        path = os.path.join(args.checkpoints, name)
        if os.path.isfile(os.path.join(path, "config.json")):
            run_one(name, path, args)


if __name__ == "__main__":
    main()
