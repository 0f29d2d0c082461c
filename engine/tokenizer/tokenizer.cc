// Tokenizer::FromDir / FromJson and the tokenizer.json implementation behind them.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer_json.h"
#include "engine/tokenizer/utf8.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

using tokenizer_internal::TextPiece;
using tokenizer_internal::TokenizerParts;

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(TokenizerParts parts) : parts_(std::move(parts)) {
    int32_t max_id = parts_.model->max_id();
    for (const auto& [id, token] : parts_.added.tokens_by_id()) max_id = std::max(max_id, id);
    vocab_size_ = max_id + 1;
    tokens_.resize(vocab_size_);
    known_.assign(vocab_size_, false);
    token_bytes_.resize(vocab_size_);
    special_.assign(vocab_size_, false);
    for (int32_t id = 0; id < vocab_size_; ++id) {
      const std::string* token = nullptr;
      if (const auto* added = parts_.added.Find(id)) {
        token = &added->content;
      } else {
        token = parts_.model->IdToToken(id);
      }
      if (token == nullptr) continue;
      known_[id] = true;
      tokens_[id] = *token;
      // Added tokens go through the decoder too, as in Hugging Face's decode.
      token_bytes_[id] = tokenizer_internal::ByteLevelTokenToBytes(*token);
      special_[id] = parts_.added.IsSpecialContent(*token);
    }
  }

  absl::StatusOr<std::vector<int32_t>> TryEncode(std::string_view text, bool add_special_tokens) const override {
    std::string repaired;
    if (!tokenizer_internal::IsValidUtf8(text)) {
      repaired = tokenizer_internal::Utf8Lossy(text);
      text = repaired;
    }
    std::vector<int32_t> ids;
    std::vector<TextPiece> pieces;
    parts_.added.Extract(text, &pieces);
    std::vector<std::string> words;
    for (const TextPiece& piece : pieces) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      words.clear();
      words.emplace_back(piece.text);
      if (parts_.pre_tokenizer != nullptr) {
        if (absl::Status st = parts_.pre_tokenizer->PreTokenize(&words); !st.ok()) return st;
      }
      for (const std::string& word : words) parts_.model->Tokenize(word, &ids);
    }
    if (!add_special_tokens) return ids;
    return parts_.special_template.Apply(std::move(ids));
  }

  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (!IsKnown(id) || (skip_special_tokens && special_[id])) continue;
      bytes += token_bytes_[id];
    }
    return tokenizer_internal::Utf8Lossy(bytes);
  }

  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> bos_id() const override { return parts_.bos_id; }
  std::optional<int32_t> eos_id() const override { return parts_.eos_id; }
  bool IsSpecial(int32_t id) const override { return IsKnown(id) && special_[id]; }
  bool IsAdded(int32_t id) const override { return IsKnown(id) && parts_.added.Find(id) != nullptr; }

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (auto id = parts_.added.TokenToId(token)) return id;
    return parts_.model->TokenToId(token);
  }
  std::string IdToToken(int32_t id) const override { return IsKnown(id) ? tokens_[id] : ""; }
  std::string TokenBytes(int32_t id) const override { return IsKnown(id) ? token_bytes_[id] : ""; }

 private:
  bool IsKnown(int32_t id) const { return id >= 0 && id < vocab_size_ && known_[id]; }

  TokenizerParts parts_;
  int32_t vocab_size_ = 0;
  // Per id: whether it exists, its token string, the bytes it decodes to, whether it is
  // a special token (by content, as Hugging Face checks when skipping them).
  std::vector<bool> known_;
  std::vector<std::string> tokens_;
  std::vector<std::string> token_bytes_;
  std::vector<bool> special_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return contents.str();
}

}  // namespace

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  absl::StatusOr<std::vector<int32_t>> ids = TryEncode(text, add_special_tokens);
  TANDEM_CHECK(ids.ok()) << ids.status().ToString();
  return *std::move(ids);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDir(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(dir + "/tokenizer.json"));
  std::string config_json;
  if (auto config = ReadFile(dir + "/tokenizer_config.json"); config.ok()) {
    config_json = *std::move(config);
  } else if (!absl::IsNotFound(config.status())) {
    return config.status();
  }
  return FromJson(tokenizer_json, config_json);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json) {
  ASSIGN_OR_RETURN(TokenizerParts parts,
                   tokenizer_internal::ParseTokenizerFiles(tokenizer_json, config_json));
  return std::unique_ptr<Tokenizer>(new HfTokenizer(std::move(parts)));
}

}  // namespace tandem
