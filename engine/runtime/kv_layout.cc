#include "engine/runtime/kv_layout.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/architectures/architectures.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/weights_digest.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "xxhash.h"

namespace tandem {

absl::StatusOr<KvLayout> KvLayoutFor(const std::string& config_json_text, uint64_t weights_digest,
                                     const KvStreamOptions& options) {
  ASSIGN_OR_RETURN(ModelKvStreams kv,
                   KvStreamsForConfig(config_json_text, static_cast<int32_t>(kKvBlockSize), options));
  ASSIGN_OR_RETURN(const std::string model_type, ModelTypeOfConfig(config_json_text));
  return KvLayout{.model_id = absl::StrFormat("%s:%016x:weights-%016x", model_type,
                                              XXH64(config_json_text.data(), config_json_text.size(), 0),
                                              weights_digest),
                  .block_size = static_cast<int32_t>(kKvBlockSize),
                  .num_layers = kv.num_layers,
                  .layout_version = kKvLayoutVersion,
                  .streams = std::move(kv.streams)};
}

int64_t BlockBytes(const KvLayout& layout) { return PagedBytesPerBlock(layout.streams, layout.block_size); }

absl::StatusOr<uint64_t> AdmittedLayoutFingerprint(const std::string& model_dir, const std::string& given,
                                                   const std::string& flag, const KvStreamOptions& options) {
  if (!given.empty()) {
    uint64_t v = 0;
    if (given.size() != 16 || !absl::SimpleHexAtoi(given, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", given, "' is not 16 hex digits"));
    }
    return v;
  }
  absl::StatusOr<KvLayout> layout = KvLayoutForModel(model_dir, options);
  if (layout.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(
        layout.status().message(), ": the KV layout fingerprint covers the weights; give the checkpoint's weight "
        "files, or ", flag, " (the replicas show it in /stats)"));
  }
  if (!layout.ok()) return layout.status();
  return LayoutFingerprint(*layout);
}

std::string FingerprintHex(uint64_t fingerprint) { return absl::StrFormat("%016x", fingerprint); }

absl::StatusOr<KvLayout> KvLayoutForModel(const std::string& model_dir, const KvStreamOptions& options) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(model_dir + "/config.json"));
  ASSIGN_OR_RETURN(uint64_t weights, WeightsDigest(model_dir));
  return KvLayoutFor(text, weights, options);
}

}  // namespace tandem
