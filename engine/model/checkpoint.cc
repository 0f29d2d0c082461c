#include "engine/model/checkpoint.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {

namespace fs = std::filesystem;

absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index_file) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_file));
  nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_file, ": not a JSON object with a 'weight_map' object"));
  }
  std::map<std::string, std::string> weight_map;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_file, ": weight_map entry '", it.key(), "' is not a file name"));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_file, ": weight_map entry '", it.key(), "' names '",
                                                     shard, "', which is not a file in the checkpoint"));
    }
    weight_map[it.key()] = shard;
  }
  return weight_map;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir, AcceptedDTypes accepted) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";

  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(weight_map, ReadWeightMap(index_path.string()));
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : weight_map) {
      if (seen.insert(shard).second) shard_names.push_back(shard);
    }
  } else if (fs::exists(single_path, ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat("no model.safetensors or model.safetensors.index.json in '",
                                            dir, "'"));
  }

  std::map<std::string, std::string> owner;  // tensor -> shard it was found in
  for (const std::string& shard : shard_names) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open((root / shard).string(), accepted));
    for (const auto& [name, view] : file->tensors()) {
      auto [it, inserted] = owner.emplace(name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' appears in both '",
                                                       it->second, "' and '", shard, "'"));
      }
      ckpt->index_[name] = &view;
    }
    ckpt->files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = owner.find(name);
    if (it == owner.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path.string(), ": tensor '", name, "' is listed in '", shard, "' but no shard holds it"));
    }
    if (it->second != shard) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor '", name,
                                                     "' is listed in '", shard, "' but lies in '",
                                                     it->second, "'"));
    }
  }
  return ckpt;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, view] : index_) n += view->bytes.size();
  return n;
}

}  // namespace tandem
