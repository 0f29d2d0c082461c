#include "engine/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <memory>

#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/strings.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/common/check.h"

namespace tandem::tokenizer_internal {
namespace {

// Rust regex's Unicode `\w`, which Hugging Face uses for single_word.
bool IsWordChar(std::string_view text, size_t pos, size_t len) {
  static const Regex* const word = [] {
    auto regex = Regex::Compile(R"([\p{Alphabetic}\p{L}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
    TANDEM_CHECK(regex.ok()) << regex.status().ToString();
    return regex->release();
  }();
  return word->MatchesPrefix(text.substr(pos, len));
}

bool EndsWithWord(std::string_view text) {
  if (text.empty()) return false;
  size_t start = 0;
  DecodeUtf8Before(text, text.size(), &start);
  return IsWordChar(text, start, text.size() - start);
}

bool StartsWithWord(std::string_view text) {
  if (text.empty()) return false;
  return IsWordChar(text, 0, Utf8SequenceLength(static_cast<uint8_t>(text[0])));
}

// Offset where the whitespace run that ends `text` begins.
size_t TrailingSpaceStart(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = 0;
    if (!IsUnicodeWhiteSpace(DecodeUtf8Before(text, end, &start))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that begins `text`.
size_t LeadingSpaceLength(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!IsUnicodeWhiteSpace(DecodeUtf8(text, &next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view pattern, int32_t id) {
  if (token_id.empty()) token_id.push_back(-1);  // the root
  int32_t node = 0;
  for (char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges.find(key);
    if (it == edges.end()) {
      it = edges.emplace(key, static_cast<int32_t>(token_id.size())).first;
      token_id.push_back(-1);
    }
    node = it->second;
  }
  // The first pattern added wins among equal ones, as in aho-corasick.
  if (token_id[node] < 0) token_id[node] = id;
  first_byte[static_cast<uint8_t>(pattern[0])] = true;
}

bool AddedVocabulary::Trie::FindNext(std::string_view text, size_t from, size_t* start, size_t* end,
                                     int32_t* id) const {
  if (token_id.empty()) return false;
  for (size_t s = from; s < text.size(); ++s) {
    if (!first_byte[static_cast<uint8_t>(text[s])]) continue;
    int32_t node = 0;
    bool found = false;
    for (size_t k = s; k < text.size(); ++k) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[k]);
      auto it = edges.find(key);
      if (it == edges.end()) break;
      node = it->second;
      if (token_id[node] >= 0) {
        found = true;
        *end = k + 1;
        *id = token_id[node];
      }
    }
    if (found) {
      *start = s;
      return true;
    }
  }
  return false;
}

void AddedVocabulary::Add(const AddedToken& token, const ModelLookup& model_token_to_id,
                          size_t model_vocab_size) {
  if (token.special && !token.content.empty() && !special_contents_.contains(token.content)) {
    special_tokens_.push_back(token);
    special_contents_.insert(token.content);
  }
  if (token.content.empty()) return;
  std::optional<int32_t> id = TokenToId(token.content);
  if (id.has_value() && by_id_.at(*id) == token) return;  // already there, same options
  if (!id.has_value()) id = model_token_to_id(token.content);
  if (!id.has_value()) {
    const auto vocab_size = static_cast<int32_t>(model_vocab_size);
    if (max_id_ < 0) {
      id = vocab_size;
    } else {
      id = (max_id_ >= vocab_size || vocab_size == 0) ? max_id_ + 1 : vocab_size;
    }
  }
  max_id_ = std::max(max_id_, *id);
  content_to_id_[token.content] = *id;
  by_id_[*id] = token;
  if (!special_contents_.contains(token.content)) plain_tokens_.push_back(token);
}

void AddedVocabulary::Build() {
  raw_trie_ = Trie();
  normalized_trie_ = Trie();
  for (const auto* list : {&special_tokens_, &plain_tokens_}) {
    for (const AddedToken& token : *list) {
      const int32_t id = content_to_id_.at(token.content);
      // Normalized tokens are matched in their normalized form; the only normalizers
      // supported leave text unchanged.
      (token.normalized ? normalized_trie_ : raw_trie_).Insert(token.content, id);
    }
  }
}

std::optional<int32_t> AddedVocabulary::TokenToId(std::string_view content) const {
  auto it = content_to_id_.find(AsAbsl(content));
  if (it == content_to_id_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

void AddedVocabulary::SplitWith(const Trie& trie, std::string_view text,
                                std::vector<TextPiece>* out) const {
  size_t start_offset = 0;
  size_t search_from = 0;
  size_t start = 0, stop = 0;
  int32_t id = -1;
  while (trie.FindNext(text, search_from, &start, &stop, &id)) {
    search_from = stop;  // the matcher goes on after the match, whatever is done with it
    const AddedToken& token = by_id_.at(id);
    if (token.single_word) {
      const bool start_space = start == 0 || !EndsWithWord(text.substr(0, start));
      const bool stop_space = stop == text.size() || !StartsWithWord(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      // Whitespace a previous match already took is not taken again.
      start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    }
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({text.substr(start, stop - start), id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), -1});
}

void AddedVocabulary::Extract(std::string_view text, std::vector<TextPiece>* out) const {
  out->clear();
  std::vector<TextPiece> first;
  SplitWith(raw_trie_, text, &first);
  for (const TextPiece& piece : first) {
    if (piece.id >= 0) {
      out->push_back(piece);
    } else {
      SplitWith(normalized_trie_, piece.text, out);
    }
  }
}

}  // namespace tandem::tokenizer_internal
