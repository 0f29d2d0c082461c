#include "engine/tokenizer/tokenizer_json.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer/strings.h"
#include "engine/util/status_macros.h"

namespace tandem::tokenizer_internal {
namespace {

using Json = nlohmann::json;

// A field of one of the two files, for error messages: "tokenizer.json: model.vocab".
struct Where {
  std::string_view file;
  std::string path;
  Where operator/(std::string_view key) const {
    return Where{file, path.empty() ? std::string(key) : absl::StrCat(path, ".", AsAbsl(key))};
  }
  Where operator[](size_t index) const { return Where{file, absl::StrCat(path, "[", index, "]")}; }
};

absl::Status Invalid(const Where& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(AsAbsl(where.file), ": ", where.path, ": ", what));
}

absl::Status Unsupported(const Where& where, std::string_view type) {
  return Invalid(where, absl::StrCat("type '", AsAbsl(type), "' is not supported"));
}

// The member `key` of object `obj`, or nullptr when absent or null.
const Json* Member(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const Json& obj, const Where& where, std::string_view key,
                             bool default_value) {
  const Json* value = Member(obj, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) return Invalid(where / key, "expected a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& obj, const Where& where,
                                                             std::string_view key) {
  const Json* value = Member(obj, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return Invalid(where / key, "expected a string");
  return std::optional<std::string>(value->get<std::string>());
}

absl::StatusOr<std::string> GetString(const Json& obj, const Where& where, std::string_view key) {
  ASSIGN_OR_RETURN(std::optional<std::string> value, GetOptionalString(obj, where, key));
  if (!value) return Invalid(where / key, "missing (expected a string)");
  return *value;
}

absl::StatusOr<int32_t> ToId(const Json& value, const Where& where) {
  if (!value.is_number_integer()) return Invalid(where, "expected an integer id");
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) return Invalid(where, "id out of range");
  return static_cast<int32_t>(id);
}

absl::StatusOr<const Json*> GetArray(const Json& obj, const Where& where, std::string_view key) {
  const Json* value = Member(obj, key);
  if (value == nullptr || !value->is_array()) return Invalid(where / key, "expected an array");
  return value;
}

// The "type" of a component object.
absl::StatusOr<std::string> TypeOf(const Json& component, const Where& where) {
  if (!component.is_object()) return Invalid(where, "expected an object");
  return GetString(component, where, "type");
}

// ---- normalizer ----

absl::Status CheckNormalizer(const Json& normalizer, const Where& where) {
  if (normalizer.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string type, TypeOf(normalizer, where));
  if (type != "Sequence") return Unsupported(where, type);
  ASSIGN_OR_RETURN(const Json* steps, GetArray(normalizer, where, "normalizers"));
  for (size_t i = 0; i < steps->size(); ++i) {
    RETURN_IF_ERROR(CheckNormalizer((*steps)[i], (where / "normalizers")[i]));
  }
  return absl::OkStatus();
}

// ---- pre_tokenizer ----

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& name, const Where& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Invalid(where, absl::StrCat("unknown behavior '", name, "'"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                const Where& where) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* steps, GetArray(json, where, "pretokenizers"));
    std::vector<std::unique_ptr<PreTokenizer>> parsed;
    for (size_t i = 0; i < steps->size(); ++i) {
      ASSIGN_OR_RETURN(auto step, ParsePreTokenizer((*steps)[i], (where / "pretokenizers")[i]));
      parsed.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parsed)));
  }
  if (type == "Split") {
    const Json* pattern = Member(json, "pattern");
    const Where pattern_where = where / "pattern";
    if (pattern == nullptr || !pattern->is_object()) {
      return Invalid(pattern_where, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    std::string regex_source;
    if (const Json* regex = Member(*pattern, "Regex")) {
      if (!regex->is_string()) return Invalid(pattern_where / "Regex", "expected a string");
      regex_source = regex->get<std::string>();
    } else if (const Json* literal = Member(*pattern, "String")) {
      if (!literal->is_string()) return Invalid(pattern_where / "String", "expected a string");
      regex_source = Regex::Escape(literal->get<std::string>());
    } else {
      return Invalid(pattern_where, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    auto regex = Regex::Compile(regex_source);
    if (!regex.ok()) return Invalid(pattern_where, regex.status().message());
    ASSIGN_OR_RETURN(std::string behavior_name, GetString(json, where, "behavior"));
    ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(behavior_name, where / "behavior"));
    ASSIGN_OR_RETURN(bool invert, GetBool(json, where, "invert", false));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(*std::move(regex), behavior, invert));
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space, GetBool(json, where, "add_prefix_space", true));
    ASSIGN_OR_RETURN(bool use_regex, GetBool(json, where, "use_regex", true));
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, use_regex));
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(bool individual, GetBool(json, where, "individual_digits", false));
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(individual));
  }
  return Unsupported(where, type);
}

// ---- model ----

absl::StatusOr<std::unique_ptr<BpeModel>> ParseModel(const Json& json, const Where& where) {
  if (!json.is_object()) return Invalid(where, "expected an object");
  if (const Json* type = Member(json, "type")) {
    if (!type->is_string()) return Invalid(where / "type", "expected a string");
    if (type->get<std::string>() != "BPE") return Unsupported(where, type->get<std::string>());
  }
  if (const Json* dropout = Member(json, "dropout")) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      return Invalid(where / "dropout", "BPE dropout is not supported");
    }
  }
  const Json* vocab_json = Member(json, "vocab");
  if (vocab_json == nullptr || !vocab_json->is_object()) {
    return Invalid(where / "vocab", "expected an object of token -> id");
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json->size());
  for (const auto& [token, id_json] : vocab_json->get_ref<const Json::object_t&>()) {
    ASSIGN_OR_RETURN(int32_t id, ToId(id_json, where / "vocab" / token));
    vocab.emplace_back(token, id);
  }

  ASSIGN_OR_RETURN(const Json* merges_json, GetArray(json, where, "merges"));
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json->size());
  for (size_t i = 0; i < merges_json->size(); ++i) {
    const Json& merge = (*merges_json)[i];
    if (merge.is_string()) {
      // "a b", as in a merges.txt; "#version" lines are comments.
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) {
        return Invalid((where / "merges")[i], absl::StrCat("expected \"a b\", got \"", line, "\""));
      }
      merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Invalid((where / "merges")[i], "expected \"a b\" or [\"a\", \"b\"]");
    }
  }

  BpeOptions options;
  ASSIGN_OR_RETURN(options.unk_token, GetOptionalString(json, where, "unk_token"));
  ASSIGN_OR_RETURN(auto prefix, GetOptionalString(json, where, "continuing_subword_prefix"));
  options.continuing_subword_prefix = prefix.value_or("");
  ASSIGN_OR_RETURN(auto suffix, GetOptionalString(json, where, "end_of_word_suffix"));
  options.end_of_word_suffix = suffix.value_or("");
  ASSIGN_OR_RETURN(options.fuse_unk, GetBool(json, where, "fuse_unk", false));
  ASSIGN_OR_RETURN(options.byte_fallback, GetBool(json, where, "byte_fallback", false));
  ASSIGN_OR_RETURN(options.ignore_merges, GetBool(json, where, "ignore_merges", false));
  auto model = BpeModel::Create(std::move(vocab), merges, std::move(options));
  if (!model.ok()) return Invalid(where, model.status().message());
  return model;
}

// ---- added_tokens ----

absl::Status AddTokens(const Json& json, const Where& where, const BpeModel& model,
                       AddedVocabulary* added) {
  if (!json.is_array()) return Invalid(where, "expected an array");
  auto lookup = [&model](std::string_view content) { return model.TokenToId(content); };
  for (size_t i = 0; i < json.size(); ++i) {
    const Json& entry = json[i];
    const Where at = where[i];
    if (!entry.is_object()) return Invalid(at, "expected an object");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, GetString(entry, at, "content"));
    ASSIGN_OR_RETURN(token.special, GetBool(entry, at, "special", false));
    ASSIGN_OR_RETURN(token.single_word, GetBool(entry, at, "single_word", false));
    ASSIGN_OR_RETURN(token.lstrip, GetBool(entry, at, "lstrip", false));
    ASSIGN_OR_RETURN(token.rstrip, GetBool(entry, at, "rstrip", false));
    ASSIGN_OR_RETURN(token.normalized, GetBool(entry, at, "normalized", !token.special));
    // The id in the file is only a record: Hugging Face derives the id from the
    // vocabulary (and warns when they differ); so does this.
    if (const Json* id = Member(entry, "id")) RETURN_IF_ERROR(ToId(*id, at / "id").status());
    added->Add(token, lookup, model.size());
  }
  added->Build();
  return absl::OkStatus();
}

// ---- post_processor ----

absl::StatusOr<std::pair<std::string, int32_t>> TokenAndId(const Json& json, const Where& where) {
  if (!json.is_array() || json.size() != 2 || !json[0].is_string()) {
    return Invalid(where, "expected [token, id]");
  }
  ASSIGN_OR_RETURN(int32_t id, ToId(json[1], where));
  return std::make_pair(json[0].get<std::string>(), id);
}

absl::StatusOr<SpecialTokenTemplate> ParsePostProcessor(const Json& json, const Where& where) {
  if (json.is_null()) return SpecialTokenTemplate();
  ASSIGN_OR_RETURN(std::string type, TypeOf(json, where));
  using Item = SpecialTokenTemplate::Item;
  if (type == "ByteLevel") return SpecialTokenTemplate();  // offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const Json* cls = Member(json, "cls");
    const Json* sep = Member(json, "sep");
    if (cls == nullptr) return Invalid(where / "cls", "missing");
    if (sep == nullptr) return Invalid(where / "sep", "missing");
    ASSIGN_OR_RETURN(auto cls_token, TokenAndId(*cls, where / "cls"));
    ASSIGN_OR_RETURN(auto sep_token, TokenAndId(*sep, where / "sep"));
    return SpecialTokenTemplate(
        {Item{false, {cls_token.second}}, Item{true, {}}, Item{false, {sep_token.second}}});
  }
  if (type == "TemplateProcessing") {
    ASSIGN_OR_RETURN(const Json* single, GetArray(json, where, "single"));
    const Json* specials = Member(json, "special_tokens");
    std::vector<Item> items;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& piece = (*single)[i];
      const Where at = (where / "single")[i];
      if (const Json* sequence = piece.is_object() ? Member(piece, "Sequence") : nullptr) {
        ASSIGN_OR_RETURN(std::string id, GetString(*sequence, at / "Sequence", "id"));
        if (id == "A") items.push_back(Item{true, {}});
        continue;  // $B has no place in a single sequence
      }
      const Json* special = piece.is_object() ? Member(piece, "SpecialToken") : nullptr;
      if (special == nullptr) return Invalid(at, "expected {\"Sequence\"} or {\"SpecialToken\"}");
      ASSIGN_OR_RETURN(std::string name, GetString(*special, at / "SpecialToken", "id"));
      const Json* entry =
          specials != nullptr && specials->is_object() ? Member(*specials, name) : nullptr;
      if (entry == nullptr) {
        return Invalid(where / "special_tokens", absl::StrCat("missing entry for '", name, "'"));
      }
      const Where entry_where = where / "special_tokens" / name;
      ASSIGN_OR_RETURN(const Json* ids_json, GetArray(*entry, entry_where, "ids"));
      Item item;
      for (size_t k = 0; k < ids_json->size(); ++k) {
        ASSIGN_OR_RETURN(int32_t id, ToId((*ids_json)[k], (entry_where / "ids")[k]));
        item.ids.push_back(id);
      }
      items.push_back(std::move(item));
    }
    return SpecialTokenTemplate(std::move(items));
  }
  if (type == "Sequence") {
    // Each processor wraps what the previous ones produced.
    ASSIGN_OR_RETURN(const Json* steps, GetArray(json, where, "processors"));
    std::vector<Item> items = {Item{true, {}}};
    for (size_t i = 0; i < steps->size(); ++i) {
      ASSIGN_OR_RETURN(SpecialTokenTemplate step,
                       ParsePostProcessor((*steps)[i], (where / "processors")[i]));
      std::vector<Item> expanded;
      for (const Item& item : step.items()) {
        if (item.is_sequence) {
          expanded.insert(expanded.end(), items.begin(), items.end());
        } else {
          expanded.push_back(item);
        }
      }
      items = std::move(expanded);
    }
    return SpecialTokenTemplate(std::move(items));
  }
  return Unsupported(where, type);
}

// ---- decoder ----

absl::Status CheckDecoder(const Json& json, const Where& where) {
  if (json.is_null()) return Invalid(where, "missing (only the ByteLevel decoder is supported)");
  ASSIGN_OR_RETURN(std::string type, TypeOf(json, where));
  if (type != "ByteLevel") return Unsupported(where, type);
  return absl::OkStatus();
}

// ---- tokenizer_config.json ----

// bos_token / eos_token: a string, {"content": ...}, or null.
absl::StatusOr<std::optional<std::string>> SpecialTokenContent(const Json& config,
                                                               const Where& where,
                                                               std::string_view key) {
  const Json* value = Member(config, key);
  if (value == nullptr) return std::optional<std::string>();
  if (value->is_string()) return std::optional<std::string>(value->get<std::string>());
  if (value->is_object()) {
    ASSIGN_OR_RETURN(std::string content, GetString(*value, where / key, "content"));
    return std::optional<std::string>(content);
  }
  return Invalid(where / key, "expected a string or an object with \"content\"");
}

absl::Status ApplyConfig(const Json& config, TokenizerParts* parts) {
  const Where where{"tokenizer_config.json", ""};
  if (!config.is_object()) {
    return Invalid(Where{"tokenizer_config.json", "(top level)"}, "expected an object");
  }
  auto lookup = [parts](const std::string& content) -> std::optional<int32_t> {
    if (auto id = parts->added.TokenToId(content)) return id;
    return parts->model->TokenToId(content);
  };
  std::optional<int32_t>* ids[2] = {&parts->bos_id, &parts->eos_id};
  const char* keys[2] = {"bos_token", "eos_token"};
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(std::optional<std::string> content,
                     SpecialTokenContent(config, where, keys[k]));
    if (content) *ids[k] = lookup(*content);
  }
  const Json* add_bos = Member(config, "add_bos_token");
  const Json* add_eos = Member(config, "add_eos_token");
  if (add_bos == nullptr && add_eos == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(bool bos, GetBool(config, where, "add_bos_token", false));
  ASSIGN_OR_RETURN(bool eos, GetBool(config, where, "add_eos_token", false));
  if (bos && !parts->bos_id) {
    return Invalid(where / "bos_token",
                   "add_bos_token is true but the bos token is missing or not in the vocabulary");
  }
  if (eos && !parts->eos_id) {
    return Invalid(where / "eos_token",
                   "add_eos_token is true but the eos token is missing or not in the vocabulary");
  }
  using Item = SpecialTokenTemplate::Item;
  std::vector<Item> items;
  if (bos) items.push_back(Item{false, {*parts->bos_id}});
  items.push_back(Item{true, {}});
  if (eos) items.push_back(Item{false, {*parts->eos_id}});
  parts->special_template = SpecialTokenTemplate(std::move(items));
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view file) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    // Parse again with exceptions for the position and reason.
    try {
      Json ignored = Json::parse(text.begin(), text.end());
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(AsAbsl(file), ": malformed JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(file), ": malformed JSON"));
  }
  return json;
}

absl::StatusOr<TokenizerParts> Parse(std::string_view tokenizer_json,
                                     std::string_view config_json) {
  ASSIGN_OR_RETURN(Json json, ParseJson(tokenizer_json, "tokenizer.json"));
  const Where root{"tokenizer.json", ""};
  if (!json.is_object()) {
    return Invalid(Where{"tokenizer.json", "(top level)"}, "expected an object");
  }
  if (const Json* version = Member(json, "version")) {
    if (!version->is_string() || version->get<std::string>() != "1.0") {
      return Invalid(root / "version", "unknown tokenizer version (expected \"1.0\")");
    }
  }
  TokenizerParts parts;
  const Json* model = Member(json, "model");
  if (model == nullptr) return Invalid(root / "model", "missing");
  ASSIGN_OR_RETURN(parts.model, ParseModel(*model, root / "model"));
  RETURN_IF_ERROR(CheckNormalizer(json.value("normalizer", Json()), root / "normalizer"));
  if (const Json* pre = Member(json, "pre_tokenizer")) {
    ASSIGN_OR_RETURN(parts.pre_tokenizer, ParsePreTokenizer(*pre, root / "pre_tokenizer"));
  }
  if (const Json* added = Member(json, "added_tokens")) {
    RETURN_IF_ERROR(AddTokens(*added, root / "added_tokens", *parts.model, &parts.added));
  } else {
    parts.added.Build();
  }
  ASSIGN_OR_RETURN(parts.special_template, ParsePostProcessor(json.value("post_processor", Json()),
                                                              root / "post_processor"));
  RETURN_IF_ERROR(CheckDecoder(json.value("decoder", Json()), root / "decoder"));
  // truncation and padding are ignored, as transformers does for encode() by default.

  if (!config_json.empty()) {
    ASSIGN_OR_RETURN(Json config, ParseJson(config_json, "tokenizer_config.json"));
    RETURN_IF_ERROR(ApplyConfig(config, &parts));
  }
  return parts;
}

}  // namespace

absl::StatusOr<TokenizerParts> ParseTokenizerFiles(std::string_view tokenizer_json,
                                                   std::string_view config_json) {
  try {
    return Parse(tokenizer_json, config_json);
  } catch (const std::exception& e) {
    // Every access above is type-checked first; this is a safety net only.
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

}  // namespace tandem::tokenizer_internal
