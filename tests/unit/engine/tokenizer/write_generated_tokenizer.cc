// Writes BuildByteLevelTokenizer(vocab_size)'s files into a directory, for the reference
// test fixtures (the Hugging Face reference script reads them from there).
//   write_generated_tokenizer OUT_DIR VOCAB_SIZE [mixed]
// "mixed" swaps in a pre-tokenizer that uses every supported step and behavior (GPT-2's
// ByteLevel regex with add_prefix_space, Digits, Split with each delimiter behavior,
// inverted, literal patterns) and adds tokens with lstrip / rstrip / single_word, so that
// the reference comparison covers them too.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/tokenizer/byte_level_tokenizer_builder.h"

namespace {

using OrderedJson = nlohmann::ordered_json;

OrderedJson Split(OrderedJson pattern, const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

std::string MixedVariant(const std::string& tokenizer_json) {
  OrderedJson json = OrderedJson::parse(tokenizer_json);
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {Split({{"String", "--"}}, "MergedWithNext"),
                             Split({{"Regex", "[.!?]+"}}, "MergedWithPrevious"),
                             Split({{"String", std::string(1, '\0')}}, "Removed"),
                             {{"type", "Digits"}, {"individual_digits", false}},
                             Split({{"Regex", "\\p{Lu}"}}, "Contiguous"),
                             Split({{"Regex", "[^\\s]+"}}, "Isolated", /*invert=*/true),
                             {{"type", "ByteLevel"},
                              {"add_prefix_space", true},
                              {"trim_offsets", true},
                              {"use_regex", true}}}}};
  int next_id = static_cast<int>(json["model"]["vocab"].size());
  auto add = [&](const char* content, bool special, bool normalized, bool lstrip, bool rstrip,
                 bool single_word) {
    json["added_tokens"].push_back({{"id", next_id++},
                                    {"content", content},
                                    {"single_word", single_word},
                                    {"lstrip", lstrip},
                                    {"rstrip", rstrip},
                                    {"normalized", normalized},
                                    {"special", special}});
  };
  add("<mask>", true, false, true, true, false);
  add("<|EOT|>", true, false, false, true, false);
  add("[NAME]", false, true, true, false, false);
  add("the", false, true, false, false, true);
  add("\u4e2d\u6587", false, true, false, false, true);  // 中文
  add("ing ", false, false, false, false, false);
  add("\xef\xbd\x9c", false, true, false, false, false);  // ｜, inside DeepSeek-style tokens
  return json.dump(1) + "\n";
}

bool WriteFile(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  const bool mixed = argc == 4 && std::string(argv[3]) == "mixed";
  if (argc != 3 && !mixed) {
    std::fprintf(stderr, "usage: %s OUT_DIR VOCAB_SIZE [mixed]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const int vocab_size = std::atoi(argv[2]);
  if (vocab_size < 300) {
    std::fprintf(stderr, "VOCAB_SIZE must be at least 300\n");
    return 2;
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  tandem::GeneratedTokenizerFiles files = tandem::BuildByteLevelTokenizer(vocab_size);
  if (mixed) files.tokenizer_json = MixedVariant(files.tokenizer_json);
  if (!WriteFile(dir / "tokenizer.json", files.tokenizer_json) ||
      !WriteFile(dir / "tokenizer_config.json", files.tokenizer_config_json)) {
    std::fprintf(stderr, "cannot write into %s\n", dir.c_str());
    return 1;
  }
  std::printf("wrote %s/tokenizer.json (%d ids)\n", dir.c_str(), vocab_size);
  return 0;
}
