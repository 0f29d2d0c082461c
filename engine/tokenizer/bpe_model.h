// The BPE model of a tokenizer.json: turns one pre-tokenized piece into token ids, with
// Hugging Face's merge order (lowest rank first; on equal ranks the leftmost), in
// O(n log n) for a piece of n characters. Thread-safe; a bounded cache remembers the ids
// of short pieces already seen.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem::tokenizer_internal {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  size_t cache_capacity = 10000;  // pieces; 0 disables the cache
};

class BpeModel {
 public:
  // `vocab`: token -> id; `merges`: pairs in rank order. Errors: INVALID_ARGUMENT when a
  // merge names a token (either side, or their concatenation) missing from the vocabulary,
  // or the unk token is missing.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      std::vector<std::pair<std::string, int32_t>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of `piece` (valid UTF-8) to `ids`.
  void Tokenize(std::string_view piece, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token of `id`, or nullptr.
  const std::string* IdToToken(int32_t id) const;
  // Number of entries in the vocabulary (what Hugging Face calls the model's vocab size).
  size_t size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  struct CacheShard {
    mutable std::shared_mutex mutex;
    absl::flat_hash_map<std::string, std::vector<int32_t>> entries;
  };
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kMaxCachedLength = 256;  // bytes, as Hugging Face

  explicit BpeModel(BpeOptions options) : options_(std::move(options)) {}
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void MergeWord(std::string_view piece, std::vector<int32_t>* ids) const;

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::unique_ptr<CacheShard[]> cache_;
  size_t shard_capacity_ = 0;
};

}  // namespace tandem::tokenizer_internal
