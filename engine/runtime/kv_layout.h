// The KV layout a model's replicas exchange (docs/design.md §2, §4): which model, element type,
// block size and entry size. Its fingerprint travels with every request that moves KV, so
// replicas of different builds or models never exchange KV silently. The model's identity
// is its config.json and a digest of every byte of its weights
// (engine/model/weights_digest.h): two fine-tunes of one base have the same config and
// safetensors headers, and only the weights' bytes tell their KV apart.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/architectures/architectures.h"
#include "engine/runtime/block_hash.h"

namespace tandem {

// Bump when the meaning of KV bytes changes (entry layout, RoPE placement, dtype rules).
// Version 2: the layout is a set of named streams (engine/model/kv_streams.h).
inline constexpr int32_t kKvLayoutVersion = 2;

// The layout of `model_dir`'s KV as this build stores it: the streams its architecture
// declares (engine/architectures), in blocks of 64 tokens. Reads every weight file once
// (WeightsDigest: NOT_FOUND when the directory has none).
absl::StatusOr<KvLayout> KvLayoutForModel(const std::string& model_dir, const KvStreamOptions& options = {});
// The same from config.json's text and the weights' digest (0 where only the geometry
// matters). Errors: the architecture's, for an unknown model_type or a bad field.
// options: what the KV holds beyond the decoder layers' (the MTP layer's with speculative
// decoding), which changes the fingerprint.
absl::StatusOr<KvLayout> KvLayoutFor(const std::string& config_json_text, uint64_t weights_digest,
                                     const KvStreamOptions& options = {});

// Bytes of one token block over every paged stream of `layout` (the kvstore's block, the
// prefill -> decode transfer's per-block bytes).
int64_t BlockBytes(const KvLayout& layout);

// For processes that hold KV without running the model (router, kvstore): the fingerprint
// they admit. `given` (16 hex digits, what the replicas show as layout_fingerprint in their
// /stats and startup log) when not empty; else LayoutFingerprint(KvLayoutForModel(model_dir)),
// which needs the weight files. Errors name `flag`.
absl::StatusOr<uint64_t> AdmittedLayoutFingerprint(const std::string& model_dir, const std::string& given,
                                                   const std::string& flag, const KvStreamOptions& options = {});
// 16 lower-case hex digits.
std::string FingerprintHex(uint64_t fingerprint);

}  // namespace tandem
