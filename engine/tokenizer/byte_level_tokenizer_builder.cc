#include "engine/tokenizer/byte_level_tokenizer_builder.h"

#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr const char* kSpecialTokens[] = {
    "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>",
    "<\uFF5Cend\u2581of\u2581sentence\uFF5C>",
    "<\uFF5C\u2581pad\u2581\uFF5C>",
};

// DeepSeek-V3's pre-tokenization: digits in groups of up to three, runs of CJK / kana,
// then words, punctuation and whitespace; the ByteLevel step only maps bytes.
constexpr const char* kVocabPlaceholder = "@@vocab@@";
constexpr const char* kDigitsPattern = "\\p{N}{1,3}";
constexpr const char* kCjkPattern = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
constexpr const char* kWordPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

// Words and fragments the first merges form, each also with a leading space and
// capitalized. Order matters: earlier entries get lower ranks.
constexpr std::string_view kWords[] = {
    "the",     "of",        "and",    "to",      "in",      "is",      "it",       "that",
    "for",     "on",        "was",    "with",    "as",      "at",      "be",       "by",
    "this",    "are",       "or",     "from",    "an",      "but",     "not",      "you",
    "he",      "she",       "they",   "we",      "his",     "her",     "their",    "have",
    "has",     "had",       "were",   "which",   "one",     "all",     "can",      "will",
    "would",   "there",     "what",   "so",      "if",      "about",   "out",      "up",
    "more",    "when",      "who",    "no",      "some",    "time",    "like",     "just",
    "into",    "than",      "them",   "other",   "new",     "also",    "its",      "only",
    "any",     "how",       "two",    "first",   "after",   "most",    "over",     "very",
    "your",    "our",       "may",    "these",   "could",   "then",    "do",       "did",
    "made",    "make",      "see",    "way",     "use",     "used",    "many",     "much",
    "each",    "well",      "where",  "between", "because", "through", "while",    "should",
    "world",   "people",    "year",   "years",   "day",     "work",    "life",     "good",
    "great",   "small",     "large",  "long",    "little",  "own",     "right",    "old",
    "same",    "under",     "never",  "before",  "here",    "again",   "still",    "last",
    "know",    "think",     "take",   "come",    "want",    "look",    "give",     "find",
    "tell",    "ask",       "feel",   "try",     "call",    "need",    "help",     "start",
    "show",    "hear",      "play",   "run",     "move",    "live",    "read",     "write",
    "learn",   "change",    "number", "water",   "word",    "name",    "hand",     "part",
    "place",   "point",     "home",   "house",   "city",    "country", "system",   "model",
    "data",    "value",     "string", "list",    "file",    "line",    "code",     "text",
    "token",   "input",     "output", "test",    "error",   "result",  "return",   "self",
    "def",     "class",     "import", "from",    "print",   "None",    "True",     "False",
    "int",     "float",     "char",   "void",    "const",   "static",  "auto",     "std",
    "include", "namespace", "struct", "public",  "private", "if",      "else",     "for",
    "while",   "size",      "vector", "map",     "key",     "type",    "function", "method",
    "object",  "array",     "ing",    "tion",    "ed",      "er",      "ly",       "es",
    "ment",    "ness",      "able",   "ity",     "ous",     "ive",     "al",       "re",
    "un",      "in",        "dis",    "pre",     "con",     "com",     "pro",      "ex",
    "st",      "th",        "ch",     "sh",      "wh",      "ou",      "ea",       "ai",
    "ee",      "oo",        "ar",     "or",      "ir",      "ur",      "en",       "an",
    "on",      "at",        "it",     "ion",     "est",     "ure",     "ant",      "ent",
    "ight",    "ould",      "ake",    "ame",     "ine",     "    ",    "        ", "\n\n",
    "\n    ",  "//",        "/*",     "*/",      "::",      "->",      "==",       "!=",
    "<=",      ">=",        "&&",     "||",      "++",      "+=",      "();",      "()",
    "{}",      "[]",        "\"\"",   "...",     ", ",      ". ",
};

class Builder {
 public:
  explicit Builder(int vocab_size) : vocab_size_(vocab_size) {
    for (const char* special : kSpecialTokens) Add(special);
    for (int b = 0; b < 256; ++b) {
      Add(std::string(tokenizer_internal::ByteLevelChar(static_cast<uint8_t>(b))));
    }
  }

  bool Full() const { return static_cast<int>(tokens_.size()) >= vocab_size_; }

  // Adds the merges forming `bytes` left to right, as far as the vocabulary allows.
  void Form(std::string_view bytes) {
    std::string prefix;
    for (size_t i = 0; i < bytes.size() && !Full(); ++i) {
      const std::string next(tokenizer_internal::ByteLevelChar(static_cast<uint8_t>(bytes[i])));
      if (i > 0) Merge(prefix, next);
      prefix += next;
    }
  }

  // Merges pairs of earlier (non-special) tokens, in diagonal order, until full.
  void FillWithPairs() {
    const size_t first = std::size(kSpecialTokens);
    for (size_t sum = 0; !Full(); ++sum) {
      for (size_t i = 0; i <= sum && !Full(); ++i) {
        const size_t a = first + i;
        const size_t b = first + (sum - i);
        if (a >= tokens_.size() || b >= tokens_.size()) continue;
        if (tokens_[a].size() + tokens_[b].size() > 24) continue;  // keep tokens short
        Merge(tokens_[a], tokens_[b]);
      }
    }
  }

  GeneratedTokenizerFiles Files() const {
    OrderedJson added = OrderedJson::array();
    for (size_t id = 0; id < std::size(kSpecialTokens); ++id) {
      added.push_back({{"id", id},
                       {"content", kSpecialTokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    auto split = [](const char* pattern) {
      return OrderedJson{{"type", "Split"},
                         {"pattern", {{"Regex", pattern}}},
                         {"behavior", "Isolated"},
                         {"invert", false}};
    };
    // The vocabulary is written by hand, in id order (ordered_json's inserts are linear).
    std::string vocab = "{";
    for (size_t id = 0; id < tokens_.size(); ++id) {
      absl::StrAppend(&vocab, id == 0 ? "\n" : ",\n", OrderedJson(tokens_[id]).dump(), ": ", id);
    }
    vocab += "\n}";
    OrderedJson merges = OrderedJson::array();
    for (const auto& [a, b] : merges_) merges.push_back(absl::StrCat(a, " ", b));

    OrderedJson json = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", {{"type", "Sequence"}, {"normalizers", OrderedJson::array()}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {split(kDigitsPattern),
            split(kCjkPattern),
            split(kWordPattern),
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}}},
        {"post_processor",
         {{"type", "ByteLevel"},
          {"add_prefix_space", true},
          {"trim_offsets", false},
          {"use_regex", true}}},
        {"decoder",
         {{"type", "ByteLevel"},
          {"add_prefix_space", true},
          {"trim_offsets", true},
          {"use_regex", true}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", kVocabPlaceholder},
          {"merges", merges}}},
    };

    auto special = [](const char* content) {
      return OrderedJson{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
                         {"normalized", true},     {"rstrip", false},    {"single_word", false}};
    };
    OrderedJson config = {
        {"add_bos_token", true},
        {"add_eos_token", false},
        {"bos_token", special(kSpecialTokens[0])},
        {"clean_up_tokenization_spaces", false},
        {"eos_token", special(kSpecialTokens[1])},
        {"legacy", true},
        {"model_max_length", 131072},
        {"pad_token", special(kSpecialTokens[2])},
        {"sp_model_kwargs", OrderedJson::object()},
        {"unk_token", nullptr},
        {"tokenizer_class", "LlamaTokenizerFast"},
    };
    std::string text = json.dump(1);
    const std::string placeholder = absl::StrCat("\"", kVocabPlaceholder, "\"");
    const size_t at = text.find(placeholder);
    TANDEM_CHECK(at != std::string::npos);
    text.replace(at, placeholder.size(), vocab);
    return GeneratedTokenizerFiles{text + "\n", config.dump(2) + "\n"};
  }

 private:
  void Add(std::string token) {
    TANDEM_CHECK(known_.insert(token).second) << "duplicate token";
    tokens_.push_back(std::move(token));
  }
  void Merge(const std::string& a, const std::string& b) {
    std::string merged = a + b;
    if (Full() || known_.contains(merged)) return;
    merges_.emplace_back(a, b);
    Add(std::move(merged));
  }

  int vocab_size_;
  std::vector<std::string> tokens_;  // by id
  absl::flat_hash_set<std::string> known_;
  std::vector<std::pair<std::string, std::string>> merges_;
};

}  // namespace

GeneratedTokenizerFiles BuildByteLevelTokenizer(int vocab_size) {
  TANDEM_CHECK_GE(vocab_size, 300) << "BuildByteLevelTokenizer needs room for the 259 base tokens";
  Builder builder(vocab_size);
  for (std::string_view word : kWords) {
    std::string capitalized(word);
    if (capitalized[0] >= 'a' && capitalized[0] <= 'z') {
      capitalized[0] = static_cast<char>(capitalized[0] - 'a' + 'A');
    }
    for (const std::string& form :
         {std::string(word), " " + std::string(word), capitalized, " " + capitalized}) {
      builder.Form(form);
    }
  }
  builder.FillWithPairs();
  return builder.Files();
}

}  // namespace tandem
