// The names DeepSeek-V4 tensors go by in the three kinds of checkpoint Tandem reads
// (shared/models/deepseek-v4.md §4): DeepSeek's official ones ("layers.3.attn.wq_a.weight"),
// the ones transformers' save_pretrained writes (the official ones under "model.", with
// exceptions: "model.embed_tokens.weight", "model.hc_head.hc_fn", and the attention's
// kv_norm as "attn.norm"), and transformers' module names ("model.layers.3.self_attn.
// q_a_proj.weight", routed experts fused into gate_up_proj / down_proj). The loader
// asks for every tensor by its official name and reads whatever the checkpoint calls it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::v4 {

enum class TensorNaming { kOfficial, kTransformersSaved, kTransformersModules };

const char* TensorNamingName(TensorNaming n);  // "official", "transformers-saved", ...

// The names tensor `official` may have under `naming`, most likely first. Empty for a
// routed expert's weight under kTransformersModules (those are slices of the fused
// tensors: FusedExpertNames).
std::vector<std::string> CandidateNames(TensorNaming naming, const std::string& official);

// transformers' fused routed-expert tensors of layer `layer`, gate_up_proj
// [E, 2 * moe_intermediate, D] (w1 then w3 of each expert) and down_proj
// [E, D, moe_intermediate], where a checkpoint of `naming` may hold them:
// "model.layers.N.mlp.experts.*" (module names), and for a transformers-saved checkpoint
// that kept them fused also "model.layers.N.ffn.experts.*". Most likely first.
struct FusedExpertNames {
  std::string gate_up;
  std::string down;
};
std::vector<FusedExpertNames> FusedExperts(TensorNaming naming, int64_t layer);

// The official name of a block-scaled FP8 weight's scales, and transformers' spelling.
// ("x.weight" -> "x.scale", "x.weight_scale_inv").
std::vector<std::string> ScaleNames(const std::string& weight_name);

}  // namespace tandem::v4
