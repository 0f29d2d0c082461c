#!/usr/bin/env python3
"""DeepSeek-V4 golden logits from Hugging Face transformers (5.17, torch, float32, eager).

Run on a machine with torch, transformers >= 5.17, numpy and xxhash (the H200 machine),
from the repository root, after `scripts/goldens/regenerate_v4.sh make` wrote the
checkpoints here (they travel in .carry/goldens-v4):

    python3 scripts/device/v4_goldens.py --checkpoints .carry/goldens-v4 --out OUT

For each checkpoint of tests/goldens/v4/manifest.json (written by `tandem make-model` from
a committed config) this loads DeepseekV4ForCausalLM in float32 with eager attention on the
CPU and writes OUT/NAME.json: the prompt's ids and logits, 32 incremental decode steps
(transformers' own cache) with their logits, a 64-token greedy continuation, and the
checkpoint files' XXH64 so the C++ test knows it regenerated the same files. Logits are
base64 of little-endian float32 ([rows][vocab]); every file stays well under 1 MiB.

Loading: transformers' own from_pretrained first (its name conversion and, for FP8/FP4,
its FineGrainedFP8 dequantization). For the official-named FP8 checkpoint the script also
decodes the safetensors itself (FP8 e4m3 with 128x128 ue8m0 scales, FP4 e2m1 with per-32
ue8m0 scales) and records the largest weight difference between the two loads; if
transformers cannot load a checkpoint, its own decoding is used and the JSON says so
("loader"), with the reason.

Then (unless --skip-hf-written) it makes a checkpoint with transformers itself: the tiny
config of shared/models/deepseek-v4.md §6 (a larger position limit), randomized where
default init is trivial, saved in bf16 with save_pretrained in two or three shards into
OUT/hf_tiny_v4/ (config.json, the index, the shards), reloaded in float32, and writes
OUT/hf_tiny_v4.json the same way. At most 8 files in all, as the device returns.

Copy OUT/*.json and OUT/hf_tiny_v4/ into tests/goldens/v4/ and commit them; the C++ test
tests/unit/engine/model/deepseek_v4/v4_golden_test.cc skips until they are there.
"""
import argparse
import base64
import glob
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

try:
    import xxhash
except ImportError:  # the C++ test then cannot tell it regenerated the same files
    xxhash = None


def checkpoint_hash(path):
    if xxhash is None:
        sys.exit("xxhash (python3-xxhash) is needed to record the checkpoints' checksums")
    h = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as f:
                h[name] = xxhash.xxh64(f.read(), seed=0).hexdigest()
    return h


def b64(rows):
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<f4").tobytes()).decode("ascii")


# ---- Decoding the safetensors files ourselves (official names and formats) ----------

def e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
E8M0 = np.array([2.0 ** (b - 127) if b != 255 else np.nan for b in range(256)], dtype=np.float32)


def read_safetensors(path):
    """name -> (dtype string, shape, raw bytes)."""
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), data[b:end])
    return out


def read_checkpoint(path):
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    return tensors


def as_float(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").reshape(shape).astype(np.float32)
    if dtype == "F8_E8M0":
        return E8M0[np.frombuffer(raw, dtype=np.uint8)].reshape(shape)
    raise ValueError(f"not a float tensor: {dtype}")


def decode_weight(tensors, name):
    dtype, shape, raw = tensors[name]
    if dtype == "F8_E4M3":
        sd, ss, sr = tensors[name[: -len("weight")] + "scale"]
        scale = as_float(sd, ss, sr)
        w = E4M3[np.frombuffer(raw, dtype=np.uint8)].reshape(shape)
        rows, cols = shape
        s = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:rows, :cols]
        return w * s
    if dtype in ("I8", "U8"):
        sd, ss, sr = tensors[name[: -len("weight")] + "scale"]
        scale = as_float(sd, ss, sr)
        packed = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
        rows, half = shape
        codes = np.empty((rows, 2 * half), dtype=np.uint8)
        codes[:, 0::2] = packed & 0x0F  # low nibble first
        codes[:, 1::2] = packed >> 4
        return FP4[codes] * np.repeat(scale, 32, axis=1)[:, : 2 * half]
    if dtype == "I64":
        return np.frombuffer(raw, dtype="<i8").reshape(shape).copy()
    return as_float(dtype, shape, raw)


# Official layer suffix -> transformers module suffix (shared/models/deepseek-v4.md §4.2).
LAYER_RENAMES = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"), ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"), ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"), ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"), ("attn.attn_sink", "self_attn.sinks"),
    ("ffn.gate.weight", "mlp.gate.weight"), ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
]
TOP_RENAMES = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
               "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
               "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}


def saved_to_official(name):
    """A name as save_pretrained writes it (§4.3) -> the official one."""
    special = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
               "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
               "model.hc_head.hc_scale": "hc_head_scale"}
    if name in special:
        return special[name]
    if name.startswith("model."):
        name = name[len("model."):]
    if name.endswith(".attn.norm.weight"):  # the attention's kv_norm, as saved
        name = name[: -len("norm.weight")] + "kv_norm.weight"
    return name


def official_state_dict(path, cfg):
    """transformers' state dict from an official-named (or transformers-saved) checkpoint, decoded here."""
    tensors = read_checkpoint(path)
    if "model.embed_tokens.weight" in tensors:
        tensors = {saved_to_official(k): v for k, v in tensors.items()}
    if "embed.weight" not in tensors:
        raise ValueError("neither official nor transformers-saved tensor names")
    sd, experts = {}, {}
    for name in tensors:
        if name.startswith("mtp.") or name.endswith(".scale"):
            continue  # transformers has no MTP layers; scales go with their weights
        value = decode_weight(tensors, name)
        if name in TOP_RENAMES:
            sd[TOP_RENAMES[name]] = value
            continue
        parts = name.split(".")
        layer, rest = int(parts[1]), ".".join(parts[2:])
        if rest.startswith("ffn.experts."):
            e, w = int(parts[4]), parts[5]
            experts[(layer, e, w)] = value
            continue
        for src, dst in LAYER_RENAMES:
            if rest == src:
                sd[f"model.layers.{layer}.{dst}"] = value
                break
        else:
            raise ValueError(f"no transformers name for {name}")
    for layer in range(cfg.num_hidden_layers):
        n = cfg.n_routed_experts
        sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([experts[(layer, e, "w1")], experts[(layer, e, "w3")]], axis=0) for e in range(n)])
        sd[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack([experts[(layer, e, "w2")] for e in range(n)])
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def manual_model(path):
    cfg = AutoConfig.from_pretrained(path)
    for attr in ("quantization_config",):
        if hasattr(cfg, attr):
            delattr(cfg, attr)
    cfg._attn_implementation = "eager"
    model = transformers.DeepseekV4ForCausalLM(cfg).float().eval()
    model.load_state_dict(official_state_dict(path, cfg), strict=True)
    return model


def transformers_model(path, quantized):
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if quantized:
        kwargs["quantization_config"] = transformers.FineGrainedFP8Config(dequantize=True)
    model, info = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise RuntimeError(f"transformers did not load the checkpoint cleanly: {problems}")
    return model.float().cpu().eval()


def max_weight_difference(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        return f"different tensors: {sorted(set(sa) ^ set(sb))[:8]}"
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)


# ---- Running a model ------------------------------------------------------------------

def run(model, prompt, decode_steps, greedy_tokens):
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        prompt_logits = out.logits[0].float().numpy()
        no_cache = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
        past = out.past_key_values
        token = int(prompt_logits[-1].argmax())
        greedy, decode_inputs, decode_logits = [token], [], []
        for step in range(greedy_tokens - 1):  # one token at a time through transformers' cache
            out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float().numpy()
            if step < decode_steps:
                decode_inputs.append(token)
                decode_logits.append(logits)
            token = int(logits.argmax())
            greedy.append(token)
    return {
        "vocab_size": int(prompt_logits.shape[1]),
        "prompt_ids": [int(t) for t in prompt],
        "prompt_logits_f32_b64": b64(prompt_logits),
        "prompt_max_abs_logit": float(np.abs(prompt_logits).max()),
        "use_cache_false_max_abs_diff": float(np.abs(no_cache - prompt_logits).max()),
        "decode_input_ids": decode_inputs,
        "decode_logits_f32_b64": b64(np.stack(decode_logits)),
        "decode_max_abs_logit": float(np.abs(np.stack(decode_logits)).max()),
        "greedy_ids": greedy,
    }


def write(out_dir, name, meta):
    meta = {"name": name, "transformers": transformers.__version__, "torch": torch.__version__, **meta}
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{name}: {len(meta['prompt_ids'])} prompt tokens, {len(meta['decode_input_ids'])} decode steps, "
          f"{len(meta['greedy_ids'])} greedy tokens, max |logit| {meta['prompt_max_abs_logit']:.3f}, "
          f"loader {meta['loader']}, {os.path.getsize(path) / 1024:.0f} KiB")


def golden(entry, path, args):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    quantized = "quantization_config" in config
    meta = {"manifest": entry, "checkpoint_xxh64": checkpoint_hash(path)}
    model, reason = None, None
    try:
        model = transformers_model(path, quantized)
        meta["loader"] = "transformers from_pretrained"
    except Exception as e:  # noqa: BLE001 -- recorded, then our own decoding is used
        reason = f"{type(e).__name__}: {e}"
        print(f"{entry['name']}: transformers could not load it ({reason}); decoding the files here", file=sys.stderr)
    if quantized or model is None:
        manual = manual_model(path)
        if model is None:
            model = manual
            meta["loader"] = "v4_goldens.py's own decoding"
            meta["transformers_load_error"] = reason
        else:
            meta["own_decoding_max_weight_diff"] = max_weight_difference(model, manual)
    rng = np.random.default_rng(args.seed)
    prompt = [0] + rng.integers(3, config["vocab_size"], size=args.prompt_len - 1).tolist()
    meta.update(run(model, prompt, args.decode_steps, args.greedy_tokens))
    write(args.out, entry["name"], meta)


def hf_written(args):
    """A checkpoint transformers writes itself (save_pretrained, bf16, sharded), §6."""
    torch.manual_seed(0)
    cfg = transformers.DeepseekV4Config(
        vocab_size=128, hidden_size=64, num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25,
        q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, num_hidden_layers=4,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=8,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        index_n_heads=8, index_head_dim=16, index_topk=2, hc_mult=2, hc_sinkhorn_iters=3,
        max_position_embeddings=256, num_nextn_predict_layers=0, initializer_range=0.08,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1})
    cfg._attn_implementation = "eager"
    model = transformers.DeepseekV4ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # what default init leaves trivial (§6)
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("tid2eid"):
                p.copy_(torch.randint(0, cfg.n_routed_experts, p.shape))
            elif name.endswith("e_score_correction_bias"):
                p.normal_(0.0, 0.1)
            elif name.endswith(("sinks", "position_bias", ".base", "hc_base")):
                p.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                p.normal_(1.0, 0.5)
            elif name.endswith(("_hc.scale", "hc_scale")):
                p.normal_(1.0, 0.25)
    out = os.path.join(args.out, "hf_tiny_v4")
    # Two or three shards: the device returns at most 8 files.
    model = model.to(torch.bfloat16)
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.save_pretrained(out, max_shard_size=total // 2 + 1)
    for extra in ("generation_config.json",):  # nothing reads it; it would cost a returned file
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
    if len(shards) < 2:
        sys.exit(f"{out}: save_pretrained wrote {len(shards)} shard(s); the golden wants a sharded checkpoint")
    reloaded = transformers_model(out, quantized=False)
    rng = np.random.default_rng(args.seed)
    prompt = [0] + rng.integers(3, cfg.vocab_size, size=47).tolist()
    meta = {"loader": "transformers from_pretrained", "checkpoint_dir": "hf_tiny_v4", "shards": len(shards)}
    meta.update(run(reloaded, prompt, args.decode_steps, args.greedy_tokens))
    write(args.out, "hf_tiny_v4", meta)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--checkpoints", required=True, help="directory of checkpoints, one per manifest entry")
    p.add_argument("--manifest", default=os.path.join(root, "tests/goldens/v4/manifest.json"))
    p.add_argument("--out", required=True, help="where NAME.json (and hf_tiny_v4/) go")
    p.add_argument("--prompt-len", type=int, default=300)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--greedy-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--skip-hf-written", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    with open(args.manifest) as f:
        manifest = json.load(f)
    for entry in manifest:
        path = os.path.join(args.checkpoints, entry["name"])
        if not os.path.isfile(os.path.join(path, "config.json")):
            sys.exit(f"{path}: no checkpoint (run scripts/goldens/regenerate_v4.sh make first)")
        golden(entry, path, args)
    if not args.skip_hf_written:
        hf_written(args)


if __name__ == "__main__":
    main()
