// Added tokens (special and not) of a tokenizer.json, and their extraction from text
// before pre-tokenization, exactly as Hugging Face's AddedVocabulary does it: first the
// non-normalized tokens are matched on the raw text, then the normalized ones on the
// pieces left between them; leftmost-longest matching; lstrip / rstrip take the
// whitespace on that side into the token; single_word rejects matches inside a word.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace tandem::tokenizer_internal {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  bool operator==(const AddedToken&) const = default;
};

// A stretch of the input after extraction: an added token (id >= 0; `text` is what it
// covers, stripped whitespace included) or text left for the pre-tokenizer (id == -1).
struct TextPiece {
  std::string_view text;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  using ModelLookup = std::function<std::optional<int32_t>(std::string_view)>;

  // Adds `token` as Hugging Face's add_tokens does: its id is that of an equal content
  // already known (added first, then the model's vocabulary), else the next free id
  // after the model's vocabulary and the added tokens. Call Build() after the last Add.
  void Add(const AddedToken& token, const ModelLookup& model_token_to_id, size_t model_vocab_size);
  // Builds the matchers.
  void Build();

  std::optional<int32_t> TokenToId(std::string_view content) const;
  const AddedToken* Find(int32_t id) const;
  bool IsSpecialContent(std::string_view content) const {
    return special_contents_.contains(absl::string_view(content.data(), content.size()));
  }
  const absl::flat_hash_map<int32_t, AddedToken>& tokens_by_id() const { return by_id_; }

  // Splits `text` (valid UTF-8) into pieces; `out` is cleared first. Pieces view `text`.
  void Extract(std::string_view text, std::vector<TextPiece>* out) const;

 private:
  // A byte trie over token contents, matched leftmost-longest.
  struct Trie {
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    std::vector<int32_t> token_id;                 // per node: id of the token ending here
    bool first_byte[256] = {};
    void Insert(std::string_view pattern, int32_t id);
    // Leftmost-longest match at or after `from`: true with [*start, *end) and *id.
    bool FindNext(std::string_view text, size_t from, size_t* start, size_t* end,
                  int32_t* id) const;
  };

  void SplitWith(const Trie& trie, std::string_view text, std::vector<TextPiece>* out) const;

  absl::flat_hash_map<std::string, int32_t> content_to_id_;
  int32_t max_id_ = -1;  // largest id in content_to_id_
  absl::flat_hash_map<int32_t, AddedToken> by_id_;
  std::vector<AddedToken> special_tokens_;  // in the order added
  std::vector<AddedToken> plain_tokens_;    // the others, in the order added
  absl::flat_hash_set<std::string> special_contents_;
  Trie raw_trie_;         // tokens with normalized == false
  Trie normalized_trie_;  // tokens with normalized == true
};

}  // namespace tandem::tokenizer_internal
