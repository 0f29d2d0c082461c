#include "engine/model/weights_digest.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/model/checkpoint.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

void UpdateLe64(XXH3_state_t* state, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  XXH3_64bits_update(state, b, sizeof b);
}

// The weight files of the checkpoint, sorted by name.
absl::StatusOr<std::vector<std::string>> WeightFiles(const fs::path& root) {
  std::error_code ec;
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(auto weight_map, ReadWeightMap(index_path.string()));
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
    return std::vector<std::string>(shards.begin(), shards.end());
  }
  if (fs::exists(root / "model.safetensors", ec)) return std::vector<std::string>{"model.safetensors"};
  if (fs::exists(root / kGeneratedWeightsFile, ec)) return std::vector<std::string>{kGeneratedWeightsFile};
  return absl::NotFoundError(absl::StrCat("no weight files (model.safetensors, model.safetensors.index.json or ",
                                          kGeneratedWeightsFile, ") in '", root.string(), "'"));
}

}  // namespace

absl::StatusOr<uint64_t> WeightsDigest(const std::string& model_dir) {
  const fs::path root(model_dir);
  ASSIGN_OR_RETURN(std::vector<std::string> files, WeightFiles(root));
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (const std::string& name : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open((root / name).string()));
    const std::span<const std::byte> bytes = f->bytes();
    UpdateLe64(&state, name.size());
    XXH3_64bits_update(&state, name.data(), name.size());
    UpdateLe64(&state, bytes.size());
    // In pieces, so the mapping's pages stream through once.
    constexpr size_t kPiece = size_t{8} << 20;
    for (size_t off = 0; off < bytes.size(); off += kPiece) {
      XXH3_64bits_update(&state, bytes.data() + off, std::min(kPiece, bytes.size() - off));
    }
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace tandem
