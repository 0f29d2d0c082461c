#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <functional>
#include <mutex>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/strings.h"
#include "engine/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// One symbol of a word being merged: a token id and its neighbours (a linked list over
// the symbol array, so merging is O(1)).
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  size_t len;  // bytes; 0 marks a symbol merged into its left neighbour
};

struct QueuedMerge {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Order of Hugging Face's BinaryHeap<Merge>: lowest rank first, then lowest position.
struct LaterMerge {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    std::vector<std::pair<std::string, int32_t>> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel(std::move(options)));
  int32_t max_id = -1;
  model->vocab_.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("vocab: negative id for '", token, "'"));
    }
    max_id = std::max(max_id, id);
    model->vocab_[token] = id;
  }
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  model->has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto& [token, id] : model->vocab_) {
    model->id_to_token_[id] = token;
    model->has_id_[id] = true;
  }

  const size_t prefix_len = model->options_.continuing_subword_prefix.size();
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto a_id = model->TokenToId(a);
    if (!a_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges[", rank, "]: token '", a, "' is not in the vocabulary"));
    }
    auto b_id = model->TokenToId(b);
    if (!b_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges[", rank, "]: token '", b, "' is not in the vocabulary"));
    }
    const std::string merged = a + b.substr(std::min(prefix_len, b.size()));
    auto new_id = model->TokenToId(merged);
    if (!new_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges[", rank, "]: merged token '", merged, "' is not in the vocabulary"));
    }
    // A pair listed twice keeps its last rank, as Hugging Face's map does.
    model->merges_[PairKey(*a_id, *b_id)] = Merge{static_cast<uint32_t>(rank), *new_id};
  }

  if (model->options_.unk_token.has_value()) {
    model->unk_id_ = model->TokenToId(*model->options_.unk_token);
    if (!model->unk_id_) {
      return absl::InvalidArgumentError(
          absl::StrCat("unk_token '", *model->options_.unk_token, "' is not in the vocabulary"));
    }
  }
  if (model->options_.cache_capacity > 0) {
    model->cache_ = std::make_unique<CacheShard[]>(kCacheShards);
    model->shard_capacity_ = (model->options_.cache_capacity + kCacheShards - 1) / kCacheShards;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AsAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = TokenToId(piece)) {
      ids->push_back(*id);
      return;
    }
  }
  const bool cacheable = cache_ != nullptr && piece.size() < kMaxCachedLength;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[std::hash<std::string_view>{}(piece) % kCacheShards];
    std::shared_lock lock(shard->mutex);
    auto it = shard->entries.find(AsAbsl(piece));
    if (it != shard->entries.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(piece, ids);
  if (cacheable) {
    std::unique_lock lock(shard->mutex);
    if (shard->entries.size() < shard_capacity_) {
      shard->entries.try_emplace(std::string(piece), ids->begin() + first, ids->end());
    }
  }
}

void BpeModel::MergeWord(std::string_view piece, std::vector<int32_t>* ids) const {
  // Initial symbols: one per character (or per byte with byte_fallback, or unk).
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&symbols](int32_t id, size_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back(Symbol{id, index - 1, -1, len});
  };
  // A pending unk symbol: its byte length, 0 when none.
  size_t unk_len = 0;
  std::string scratch;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    pos += Utf8SequenceLength(static_cast<uint8_t>(piece[pos]));
    const size_t byte_len = pos - start;
    std::string_view s = piece.substr(start, byte_len);
    const bool affixed = (start > 0 && !options_.continuing_subword_prefix.empty()) ||
                         (pos == piece.size() && !options_.end_of_word_suffix.empty());
    if (affixed) {
      scratch.clear();
      if (start > 0) scratch += options_.continuing_subword_prefix;
      scratch += s;
      if (pos == piece.size()) scratch += options_.end_of_word_suffix;
      s = scratch;
    }
    if (auto id = TokenToId(s)) {
      if (unk_len > 0) {
        add(*unk_id_, unk_len);
        unk_len = 0;
      }
      add(*id, byte_len);
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<int32_t> byte_ids;
      for (char c : s) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>",
                      static_cast<unsigned>(static_cast<uint8_t>(c)));
        auto byte_id = TokenToId(name);
        if (!byte_id) break;
        byte_ids.push_back(*byte_id);
      }
      if (byte_ids.size() == s.size()) {
        for (int32_t byte_id : byte_ids) add(byte_id, 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_len > 0 && options_.fuse_unk) {
        unk_len += byte_len;
      } else {
        if (unk_len > 0) add(*unk_id_, unk_len);
        unk_len = byte_len;
      }
    }
    // Without an unk token, a character missing from the vocabulary is dropped.
  }
  if (unk_len > 0) add(*unk_id_, unk_len);

  // Merge, lowest rank first, leftmost on ties; entries made stale by earlier merges are
  // recognised and skipped when popped, as Hugging Face's Word::merge_all does.
  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, LaterMerge> queue;
  auto find_merge = [this](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push(QueuedMerge{m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale

    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[right_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push(QueuedMerge{m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push(QueuedMerge{m->rank, top.pos, m->new_id});
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.len != 0) ids->push_back(symbol.id);
  }
}

}  // namespace tandem::tokenizer_internal
