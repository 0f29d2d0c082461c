// A tokenizer's vocabulary as the grammar matcher sees it: each token id's bytes, which
// ids are special, which ids end generation (allowed only where the grammar may end),
// and a trie of the byte strings of the tokens a grammar can match.
//
// A special token (special or added in the tokenizer) is never matched by text: its
// bytes here are its marker (grammar.h TokenMarker: 0xFF, its content, 0xFE), which only
// a grammar's token terminal of that name produces. Text tokens holding 0xFE or 0xFF
// (byte-level BPE has one per byte; valid UTF-8 never holds them, so no text grammar
// ever allowed them) are left out, so that text cannot spell a marker either.
//
// The trie is laid out in preorder over the tokens sorted by their bytes: node i's
// subtree is the nodes [i, end), and the tokens below it are a contiguous range of the
// sorted order, those ending exactly at it first. Walking it with an Earley recognizer
// (push a byte going down, pop it coming back) tries every token while sharing the work
// of common prefixes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem::grammar {

class GrammarVocabulary {
 public:
  struct TrieNode {
    int32_t end = 0;           // one past the last node of this subtree
    int32_t tok_begin = 0;     // sorted_tokens()[tok_begin, tok_sub_end): the subtree's tokens
    int32_t tok_here_end = 0;  // [tok_begin, tok_here_end): those ending at this node
    int32_t tok_sub_end = 0;
    uint16_t depth = 0;    // bytes from the root
    uint16_t deepest = 0;  // the depth of the deepest node of this subtree (its longest token)
    uint8_t byte = 0;      // the last of them (none at the root)
  };

  // From a tokenizer: TokenBytes of every id below vocab_size(); IsSpecial and IsAdded
  // ids are special, named by their content; `end_tokens` (default: the tokenizer's EOS,
  // if it has one) are allowed exactly where the grammar may end.
  static std::shared_ptr<const GrammarVocabulary> FromTokenizer(const Tokenizer& tokenizer,
                                                                std::vector<int32_t> end_tokens = {});
  // From raw token bytes (tests, tools); a special id's bytes are its name (empty: it
  // cannot be named). `special` may be shorter than `token_bytes`.
  static std::shared_ptr<const GrammarVocabulary> FromTokens(std::vector<std::string> token_bytes,
                                                             std::vector<char> special,
                                                             std::vector<int32_t> end_tokens);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // 32-bit words of a bitmask over the vocabulary (bit i % 32 of word i / 32 is token i).
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  // What a grammar matches for the token (a special token's marker).
  const std::string& token_bytes(int32_t id) const { return bytes_[id]; }
  bool is_special(int32_t id) const { return special_[id] != 0; }
  // Whether a grammar can match the token's bytes: in the trie (end tokens, unnamed
  // special tokens, empty ones and text holding marker bytes are not).
  bool matchable(int32_t id) const { return matchable_[id] != 0; }
  // The special token whose content is `name`, if there is one.
  std::optional<int32_t> SpecialTokenId(std::string_view name) const;
  // The content by which a grammar names special token `id` (SpecialTokenId's inverse);
  // none for text tokens and for special tokens no name reaches (empty, holding marker
  // bytes, or sharing an earlier token's content).
  std::optional<std::string> SpecialTokenName(int32_t id) const;
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  bool is_end_token(int32_t id) const;

  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& sorted_tokens() const { return sorted_; }
  // The first `depth` bytes of node's path.
  std::string_view NodePath(int32_t node) const {
    if (trie_[node].depth == 0) return {};
    return std::string_view(bytes_[sorted_[trie_[node].tok_begin]]).substr(0, trie_[node].depth);
  }
  // A hash of everything above, for cache keys.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  void Build();

  std::vector<std::string> bytes_;
  std::vector<char> special_;
  std::vector<char> matchable_;
  absl::flat_hash_map<std::string, int32_t> special_by_name_;
  std::vector<int32_t> end_tokens_;
  std::vector<int32_t> sorted_;
  std::vector<TrieNode> trie_;
  uint64_t fingerprint_ = 0;
};

}  // namespace tandem::grammar
