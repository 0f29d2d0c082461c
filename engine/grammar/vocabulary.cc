#include "engine/grammar/vocabulary.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/grammar/grammar.h"
#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {

// FNV-1a, 64 bits: stable across runs (the cache key needs no more).
void Mix(uint64_t* h, std::string_view bytes) {
  for (char c : bytes) {
    *h ^= static_cast<uint8_t>(c);
    *h *= 0x100000001B3ull;
  }
}

}  // namespace

std::shared_ptr<const GrammarVocabulary> GrammarVocabulary::FromTokenizer(const Tokenizer& tokenizer,
                                                                          std::vector<int32_t> end_tokens) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  std::vector<char> special(bytes.size(), 0);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    special[id] = tokenizer.IsSpecial(id) || tokenizer.IsAdded(id) ? 1 : 0;
    bytes[id] = tokenizer.TokenBytes(id);
  }
  if (end_tokens.empty() && tokenizer.eos_id().has_value()) end_tokens.push_back(*tokenizer.eos_id());
  return FromTokens(std::move(bytes), std::move(special), std::move(end_tokens));
}

std::shared_ptr<const GrammarVocabulary> GrammarVocabulary::FromTokens(std::vector<std::string> token_bytes,
                                                                       std::vector<char> special,
                                                                       std::vector<int32_t> end_tokens) {
  auto v = std::shared_ptr<GrammarVocabulary>(new GrammarVocabulary());
  v->bytes_ = std::move(token_bytes);
  v->special_ = std::move(special);
  v->special_.resize(v->bytes_.size(), 0);
  std::sort(end_tokens.begin(), end_tokens.end());
  end_tokens.erase(std::unique(end_tokens.begin(), end_tokens.end()), end_tokens.end());
  for (int32_t id : end_tokens) TANDEM_CHECK(id >= 0 && id < v->size()) << id;
  v->end_tokens_ = std::move(end_tokens);
  v->Build();
  return v;
}

bool GrammarVocabulary::is_end_token(int32_t id) const {
  return std::binary_search(end_tokens_.begin(), end_tokens_.end(), id);
}

std::optional<int32_t> GrammarVocabulary::SpecialTokenId(std::string_view name) const {
  const auto it = special_by_name_.find(absl::string_view(name.data(), name.size()));
  if (it == special_by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> GrammarVocabulary::SpecialTokenName(int32_t id) const {
  if (id < 0 || id >= size() || !special_[id]) return std::nullopt;
  std::string name = bytes_[id];
  // Named special tokens other than end tokens hold their marker instead of their content.
  if (name.size() >= 2 && static_cast<uint8_t>(name.front()) == kTokenMarkerOpen &&
      static_cast<uint8_t>(name.back()) == kTokenMarkerClose) {
    name = name.substr(1, name.size() - 2);
  }
  if (SpecialTokenId(name) != id) return std::nullopt;
  return name;
}

void GrammarVocabulary::Build() {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    Mix(&h, special_[id] ? std::string_view("s", 1) : std::string_view("n", 1));
    Mix(&h, std::to_string(bytes_[id].size()));
    Mix(&h, bytes_[id]);
  }
  for (int32_t id : end_tokens_) Mix(&h, std::to_string(id) + ",");
  fingerprint_ = h;

  // End tokens are allowed where the grammar ends, not by bytes; a special token only by
  // its marker (a name holding marker bytes would make a marker ambiguous: unnamed).
  matchable_.assign(bytes_.size(), 0);
  for (int32_t id = 0; id < size(); ++id) {
    if (bytes_[id].empty() || HoldsMarkerByte(bytes_[id])) continue;
    // The first id of a name keeps it (a tokenizer's contents are distinct anyway); end
    // tokens are named too, so that a grammar naming one hears why it may not.
    if (special_[id] && !special_by_name_.try_emplace(bytes_[id], id).second) continue;
    if (is_end_token(id)) continue;
    if (special_[id]) bytes_[id] = TokenMarker(bytes_[id]);
    if (bytes_[id].size() > std::numeric_limits<uint16_t>::max()) continue;
    matchable_[id] = 1;
    sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  trie_.push_back(TrieNode{});
  std::vector<int32_t> stack = {0};
  std::string_view prev;
  const int32_t total = static_cast<int32_t>(sorted_.size());
  for (int32_t k = 0; k < total; ++k) {
    const std::string_view b = bytes_[sorted_[k]];
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    while (trie_[stack.back()].depth > lcp) {
      TrieNode& n = trie_[stack.back()];
      n.end = static_cast<int32_t>(trie_.size());
      n.tok_sub_end = k;
      stack.pop_back();
    }
    for (size_t d = lcp; d < b.size(); ++d) {
      TrieNode n;
      n.depth = static_cast<uint16_t>(d + 1);
      n.byte = static_cast<uint8_t>(b[d]);
      n.tok_begin = n.tok_here_end = k;
      trie_.push_back(n);
      stack.push_back(static_cast<int32_t>(trie_.size() - 1));
    }
    trie_[stack.back()].tok_here_end = k + 1;
    prev = b;
  }
  while (!stack.empty()) {
    TrieNode& n = trie_[stack.back()];
    n.end = static_cast<int32_t>(trie_.size());
    n.tok_sub_end = total;
    stack.pop_back();
  }
  // Children follow their parent: one pass from the back.
  for (int32_t n = static_cast<int32_t>(trie_.size()) - 1; n >= 0; --n) {
    uint16_t d = trie_[n].depth;
    for (int32_t c = n + 1; c < trie_[n].end; c = trie_[c].end) d = std::max(d, trie_[c].deepest);
    trie_[n].deepest = d;
  }
}

}  // namespace tandem::grammar
