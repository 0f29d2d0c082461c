#include "engine/grammar/json_schema_to_grammar.h"

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/json_values.h"
#include "engine/grammar/regex_to_grammar.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;
namespace jv = json_values;

constexpr int kMaxDepth = 200;

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* s = new absl::flat_hash_set<std::string>{
      "title",    "description", "default",   "examples",  "$schema",         "$id",          "$comment",
      "deprecated", "readOnly",  "writeOnly", "$defs",     "definitions",     "contentEncoding",
      "contentMediaType"};
  return *s;
}

const absl::flat_hash_set<std::string>& Handled() {
  static const auto* s = new absl::flat_hash_set<std::string>{
      "type",      "enum",      "const",       "$ref",      "anyOf",         "oneOf",
      "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
      "maxItems",  "minLength", "maxLength",   "pattern",   "format",        "minimum",
      "maximum",   "exclusiveMinimum", "exclusiveMaximum"};
  return *s;
}

const std::set<std::string>& ObjectKeywords() {
  static const auto* s = new std::set<std::string>{"properties", "required", "additionalProperties"};
  return *s;
}
const std::set<std::string>& ArrayKeywords() {
  static const auto* s = new std::set<std::string>{"items", "prefixItems", "minItems", "maxItems"};
  return *s;
}
const std::set<std::string>& StringKeywords() {
  static const auto* s = new std::set<std::string>{"minLength", "maxLength", "pattern", "format"};
  return *s;
}
const std::set<std::string>& NumberKeywords() {
  static const auto* s = new std::set<std::string>{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return *s;
}

std::string EscapePointerToken(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out.push_back(c);
  }
  return out;
}

std::string TypeOf(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::floor(d) == d && std::isfinite(d) ? "integer" : "number";
  }
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

class Converter {
 public:
  // The schema's rules go into `builder`: `rule` for the document, its sub-schemas under
  // names that start with `prefix` (and hold '#', which EBNF names never do).
  Converter(const Json& root, const JsonSchemaOptions& options, GrammarBuilder* builder, std::string rule,
            std::string prefix)
      : root_(root), options_(options), builder_(*builder), rule_(std::move(rule)), prefix_(std::move(prefix)) {
    if (options.whitespace == JsonSchemaOptions::Whitespace::kPython) {
      sep_ = {", ", ": "};
    } else {
      sep_ = {",", ":"};
    }
  }

  absl::Status AddRules() {
    ref_rules_[""] = rule_;
    used_names_.insert(rule_);
    absl::StatusOr<Expr> body = Visit(root_, "", 0);
    if (!body.ok()) return body.status();
    builder_.AddRule(rule_, *std::move(body));
    // Shared by every schema of one grammar (they have the same separators).
    if (uses_shared_ && !builder_.HasRule(jv::kValueRule)) jv::AddSharedRules(sep_, &builder_);
    return absl::OkStatus();
  }

 private:
  static std::string Where(const std::string& ptr) { return "#" + ptr; }

  absl::Status Error(const std::string& ptr, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json schema: at ", Where(ptr), ": ", std::string(what)));
  }

  std::string NewName(const std::string& base) {
    std::string name = prefix_ + (base.empty() ? "#" : Where(base));
    if (used_names_.insert(name).second) return name;
    for (int k = 2;; ++k) {
      std::string alt = absl::StrCat(name, "~", k);
      if (used_names_.insert(alt).second) return alt;
    }
  }

  Expr Any() {
    uses_shared_ = true;
    return Expr::Ref(jv::kValueRule);
  }

  // A sub-schema as a named rule (so that its several uses share it).
  absl::StatusOr<Expr> Named(const Json& s, const std::string& ptr, int depth) {
    absl::StatusOr<Expr> e = Visit(s, ptr, depth);
    if (!e.ok()) return e;
    if (e->kind == Expr::Kind::kRule) return e;
    const std::string name = NewName(ptr);
    builder_.AddRule(name, *std::move(e));
    return Expr::Ref(name);
  }

  absl::StatusOr<Expr> Visit(const Json& s, const std::string& ptr, int depth) {
    if (depth > kMaxDepth) return Error(ptr, absl::StrCat("schemas nested deeper than ", kMaxDepth));
    if (s.is_boolean()) return s.get<bool>() ? Any() : Expr::Class({}, false);
    if (!s.is_object()) return Error(ptr, "a schema must be an object or a boolean");
    std::vector<std::string> constraining;  // keywords other than annotations
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (Annotations().contains(it.key())) continue;
      if (!Handled().contains(it.key())) return Error(ptr, absl::StrCat("unsupported keyword '", it.key(), "'"));
      constraining.push_back(it.key());
    }
    if (s.contains("$ref")) {
      for (const std::string& k : constraining) {
        if (k != "$ref") return Error(ptr, absl::StrCat("'$ref' together with '", k, "' is not supported"));
      }
      return Ref(s["$ref"], ptr, depth);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const bool one = s.contains("oneOf");
      const char* key = one ? "oneOf" : "anyOf";
      for (const std::string& k : constraining) {
        if (k != key) return Error(ptr, absl::StrCat("'", key, "' together with '", k, "' is not supported"));
      }
      const Json& branches = s[key];
      if (!branches.is_array() || branches.empty()) return Error(ptr, absl::StrCat("'", key, "' must be a non-empty array"));
      if (one && branches.size() > 1 && !Disjoint(branches, 0) && options_.refuse_overlapping_one_of) {
        return Error(ptr, "'oneOf' whose branches may overlap is not supported (only branches disjoint by type or by the "
                        "const/enum of a property all of them require); anyOf accepts any match");
      }
      std::vector<Expr> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        absl::StatusOr<Expr> b = Visit(branches[i], absl::StrCat(ptr, "/", key, "/", i), depth + 1);
        if (!b.ok()) return b;
        alts.push_back(*std::move(b));
      }
      return Expr::Choice(std::move(alts));
    }
    absl::StatusOr<std::vector<std::string>> types = Types(s, ptr);
    if (!types.ok()) return types.status();
    if (s.contains("enum") || s.contains("const")) return Enum(s, ptr, *types, constraining);
    if (types->empty()) return Any();
    std::vector<Expr> alts;
    for (const std::string& t : *types) {
      absl::StatusOr<Expr> e = Typed(s, ptr, t, depth);
      if (!e.ok()) return e;
      alts.push_back(*std::move(e));
    }
    return Expr::Choice(std::move(alts));
  }

  // The types a schema without anyOf/oneOf/$ref allows; empty means any value.
  absl::StatusOr<std::vector<std::string>> Types(const Json& s, const std::string& ptr) const {
    static const std::set<std::string> kNames = {"string", "number", "integer", "boolean", "null", "object", "array"};
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      std::vector<Json> list = t.is_array() ? std::vector<Json>(t.begin(), t.end()) : std::vector<Json>{t};
      for (const Json& x : list) {
        if (!x.is_string() || !kNames.contains(x.get<std::string>())) {
          return Error(ptr, absl::StrCat("'type' ", x.dump(), " is not a JSON Schema type"));
        }
        types.push_back(x.get<std::string>());
      }
      if (types.empty()) return Error(ptr, "'type' is an empty list");
    } else {
      const auto has_any = [&](const std::set<std::string>& keys) {
        for (const std::string& k : keys) {
          if (s.contains(k)) return true;
        }
        return false;
      };
      if (has_any(ObjectKeywords())) types.push_back("object");
      if (has_any(ArrayKeywords())) types.push_back("array");
      if (has_any(StringKeywords())) types.push_back("string");
      if (has_any(NumberKeywords())) types.push_back("number");
    }
    // "integer" is inside "number".
    if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, "integer");
    std::vector<std::string> unique;
    for (const std::string& t : types) {
      if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(t);
    }
    return unique;
  }

  absl::StatusOr<Expr> Enum(const Json& s, const std::string& ptr, const std::vector<std::string>& types,
                            const std::vector<std::string>& constraining) {
    for (const std::string& k : constraining) {
      if (k != "enum" && k != "const" && k != "type") {
        return Error(ptr, absl::StrCat("'enum'/'const' together with '", k, "' is not supported"));
      }
    }
    std::vector<Json> values;
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return Error(ptr, "'enum' must be a non-empty array");
      for (const Json& v : s["enum"]) {
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
      }
    } else {
      values.push_back(s["const"]);
    }
    std::vector<Expr> alts;
    std::set<std::string> seen;
    for (const Json& v : values) {
      const std::string t = TypeOf(v);
      const bool type_ok =
          types.empty() || std::find_if(types.begin(), types.end(), [&](const std::string& x) {
                             return x == t || (x == "number" && t == "integer");
                           }) != types.end();
      if (!type_ok) continue;
      const std::string text = jv::Serialize(v, sep_);
      if (seen.insert(text).second) alts.push_back(Expr::Literal(text));
    }
    if (alts.empty()) return Expr::Class({}, false);
    return Expr::Choice(std::move(alts));
  }

  absl::StatusOr<Expr> Ref(const Json& ref, const std::string& ptr, int depth) {
    if (!ref.is_string()) return Error(ptr, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#') {
      return Error(ptr, absl::StrCat("$ref '", r, "': only references within the document ('#...') are supported"));
    }
    const std::string target = PercentDecode(std::string_view(r).substr(1));
    if (auto it = ref_rules_.find(target); it != ref_rules_.end()) return Expr::Ref(it->second);
    if (!target.empty() && target[0] != '/') {
      return Error(ptr, absl::StrCat("$ref '", r, "': anchors ('#name') are not supported"));
    }
    const Json* node = ResolvePointer(target);
    if (node == nullptr) return Error(ptr, absl::StrCat("$ref '", r, "' does not resolve"));
    const std::string name = NewName(target);
    ref_rules_[target] = name;
    absl::StatusOr<Expr> body = Visit(*node, target, depth + 1);
    if (!body.ok()) return body;
    builder_.AddRule(name, *std::move(body));
    return Expr::Ref(name);
  }

  // Whether no JSON text can match two of `branches` (a sufficient test: distinct
  // types, or a property every branch requires with disjoint const/enum values).
  bool Disjoint(const Json& branches, int depth) const {
    std::vector<std::set<std::string>> types;
    for (const Json& b : branches) types.push_back(TypeSet(b, depth));
    bool by_type = true;
    for (size_t i = 0; i < types.size() && by_type; ++i) {
      for (size_t j = i + 1; j < types.size() && by_type; ++j) {
        for (const std::string& t : types[i]) {
          if (types[j].contains(t)) by_type = false;
        }
      }
    }
    if (by_type) return true;
    // A discriminating property.
    std::vector<const Json*> objects;
    for (const Json& b : branches) {
      const Json* o = Resolve(b, depth);
      if (o == nullptr || !o->is_object() || !o->contains("properties") || !o->contains("required")) return false;
      objects.push_back(o);
    }
    for (auto it = (*objects[0])["properties"].begin(); it != (*objects[0])["properties"].end(); ++it) {
      const std::string& name = it.key();
      std::vector<std::set<std::string>> values;
      bool usable = true;
      for (const Json* o : objects) {
        const Json& req = (*o)["required"];
        const Json& props = (*o)["properties"];
        if (!req.is_array() || std::find(req.begin(), req.end(), Json(name)) == req.end() || !props.contains(name)) {
          usable = false;
          break;
        }
        const Json& p = props[name];
        std::set<std::string> vs;
        if (p.is_object() && p.contains("const")) {
          vs.insert(p["const"].dump());
        } else if (p.is_object() && p.contains("enum") && p["enum"].is_array()) {
          for (const Json& v : p["enum"]) vs.insert(v.dump());
        } else {
          usable = false;
          break;
        }
        values.push_back(std::move(vs));
      }
      if (!usable) continue;
      bool disjoint = true;
      for (size_t i = 0; i < values.size() && disjoint; ++i) {
        for (size_t j = i + 1; j < values.size() && disjoint; ++j) {
          for (const std::string& v : values[i]) {
            if (values[j].contains(v)) disjoint = false;
          }
        }
      }
      if (disjoint) return true;
    }
    return false;
  }

  // A schema with its local $ref followed (a few levels), or null.
  const Json* Resolve(const Json& s, int depth) const {
    if (depth > 8) return nullptr;
    if (!s.is_object() || !s.contains("$ref") || !s["$ref"].is_string()) return &s;
    const std::string r = s["$ref"].get<std::string>();
    if (r.empty() || r[0] != '#') return nullptr;
    const Json* t = ResolvePointer(PercentDecode(std::string_view(r).substr(1)));
    return t == nullptr ? nullptr : Resolve(*t, depth + 1);
  }

  // A JSON pointer ("" or "/a/b") into the document, or null.
  const Json* ResolvePointer(const std::string& pointer) const {
    const Json* node = &root_;
    if (pointer.empty()) return node;
    if (pointer[0] != '/') return nullptr;
    size_t i = 1;
    for (;;) {
      size_t j = pointer.find('/', i);
      if (j == std::string::npos) j = pointer.size();
      std::string token;
      for (size_t k = i; k < j; ++k) {
        if (pointer[k] == '~' && k + 1 < j && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
          token.push_back(pointer[k + 1] == '1' ? '/' : '~');
          ++k;
        } else {
          token.push_back(pointer[k]);
        }
      }
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() && token.size() < 10 &&
                 std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return nullptr;
      }
      if (j == pointer.size()) return node;
      i = j + 1;
    }
  }

  static std::string PercentDecode(std::string_view s) {
    const auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
        out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
        i += 2;
      } else {
        out.push_back(s[i]);
      }
    }
    return out;
  }

  std::set<std::string> TypeSet(const Json& b, int depth) const {
    static const std::set<std::string> kAll = {"string", "number", "boolean", "null", "object", "array"};
    const Json* s = Resolve(b, depth);
    if (s == nullptr || s->is_boolean() || !s->is_object()) return kAll;
    for (const char* key : {"anyOf", "oneOf"}) {
      if (s->contains(key) && (*s)[key].is_array()) {
        std::set<std::string> u;
        for (const Json& x : (*s)[key]) {
          for (const std::string& t : TypeSet(x, depth + 1)) u.insert(t);
        }
        return u;
      }
    }
    std::set<std::string> out;
    if (s->contains("enum") || s->contains("const")) {
      std::vector<Json> values;
      if (s->contains("const")) values.push_back((*s)["const"]);
      if (s->contains("enum") && (*s)["enum"].is_array()) values.insert(values.end(), (*s)["enum"].begin(), (*s)["enum"].end());
      for (const Json& v : values) out.insert(TypeOf(v) == "integer" ? "number" : TypeOf(v));
      return out;
    }
    absl::StatusOr<std::vector<std::string>> types = Types(*s, "");
    if (!types.ok() || types->empty()) return kAll;
    for (const std::string& t : *types) out.insert(t == "integer" ? "number" : t);
    return out;
  }

  absl::StatusOr<Expr> Typed(const Json& s, const std::string& ptr, const std::string& type, int depth) {
    if (type == "string") return String(s, ptr);
    if (type == "number" || type == "integer") return Numeric(s, ptr, type == "integer");
    if (type == "boolean") return Expr::Choice({Expr::Literal("true"), Expr::Literal("false")});
    if (type == "null") return Expr::Literal("null");
    if (type == "object") return Object(s, ptr, depth);
    return Array(s, ptr, depth);
  }

  absl::StatusOr<int> Count(const Json& s, const char* key, const std::string& ptr) const {
    const Json& v = s[key];
    if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0) ||
          (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>()))) {
      return Error(ptr, absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    const double d = v.get<double>();
    if (d > kMaxRepetition) return Error(ptr, absl::StrCat("'", key, "' above ", kMaxRepetition, " is not supported"));
    return static_cast<int>(d);
  }

  absl::StatusOr<Expr> String(const Json& s, const std::string& ptr) {
    int min = 0, max = -1;
    if (s.contains("minLength")) {
      absl::StatusOr<int> v = Count(s, "minLength", ptr);
      if (!v.ok()) return v.status();
      min = *v;
    }
    if (s.contains("maxLength")) {
      absl::StatusOr<int> v = Count(s, "maxLength", ptr);
      if (!v.ok()) return v.status();
      max = *v;
    }
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    const Expr quote = Expr::Literal("\"");
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Error(ptr, "'format' must be a string");
      if (lengths || s.contains("pattern")) {
        return Error(ptr, "'format' together with 'pattern', 'minLength' or 'maxLength' is not supported");
      }
      absl::StatusOr<Expr> content = jv::FormatContent(s["format"].get<std::string>());
      if (!content.ok()) return Error(ptr, absl::StrCat("unsupported format '", s["format"].get<std::string>(), "'"));
      return Expr::Sequence({quote, jv::EscapeForJsonString(*content), quote});
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Error(ptr, "'pattern' must be a string");
      if (lengths) return Error(ptr, "'pattern' together with 'minLength' or 'maxLength' is not supported");
      RegexOptions o;
      o.dialect = RegexDialect::kEcmaScript;
      o.search = true;
      absl::StatusOr<Expr> re = RegexToExpr(s["pattern"].get<std::string>(), o);
      if (!re.ok()) return Error(ptr, absl::StrCat("pattern: ", std::string(re.status().message())));
      return Expr::Sequence({quote, jv::EscapeForJsonString(*re), quote});
    }
    if (max >= 0 && max < min) return Expr::Class({}, false);
    uses_shared_ = true;
    return Expr::Sequence({quote, Expr::Repeat(Expr::Ref(jv::kCharRule), min, max), quote});
  }

  absl::StatusOr<std::optional<double>> NumberKeyword(const Json& s, const char* key, const std::string& ptr) const {
    if (!s.contains(key)) return std::optional<double>();
    const Json& v = s[key];
    if (v.is_boolean()) {
      return Error(ptr, absl::StrCat("boolean '", key, "' (draft 4) is not supported: use a number"));
    }
    if (!v.is_number()) return Error(ptr, absl::StrCat("'", key, "' must be a number"));
    const double d = v.get<double>();
    if (!(std::fabs(d) < 9.2e18)) return Error(ptr, absl::StrCat("'", key, "' beyond the int64 range is not supported"));
    return std::optional<double>(d);
  }

  absl::StatusOr<Expr> Numeric(const Json& s, const std::string& ptr, bool integer) {
    absl::StatusOr<std::optional<double>> min = NumberKeyword(s, "minimum", ptr);
    absl::StatusOr<std::optional<double>> xmin = NumberKeyword(s, "exclusiveMinimum", ptr);
    absl::StatusOr<std::optional<double>> max = NumberKeyword(s, "maximum", ptr);
    absl::StatusOr<std::optional<double>> xmax = NumberKeyword(s, "exclusiveMaximum", ptr);
    for (const auto* st : {&min, &xmin, &max, &xmax}) {
      if (!st->ok()) return st->status();
    }
    const std::optional<double> mn = *min, xmn = *xmin, mx = *max, xmx = *xmax;
    if (integer) {
      std::optional<int64_t> lo, hi;
      const auto raise = [&](int64_t v) { lo = lo ? std::max(*lo, v) : v; };
      const auto lower = [&](int64_t v) { hi = hi ? std::min(*hi, v) : v; };
      if (mn) raise(static_cast<int64_t>(std::ceil(*mn)));
      if (xmn) raise(static_cast<int64_t>(std::floor(*xmn)) + 1);
      if (mx) lower(static_cast<int64_t>(std::floor(*mx)));
      if (xmx) lower(static_cast<int64_t>(std::ceil(*xmx)) - 1);
      if (!lo && !hi) return jv::Integer();
      if (lo && hi && *lo > *hi) return Expr::Class({}, false);
      return jv::IntegerRange(lo, hi);
    }
    // Fractional bounds are tightened to the integers inside them.
    std::optional<jv::Bound> lo, hi;
    const auto tighter_lo = [&](jv::Bound b) {
      if (!lo || b.value > lo->value || (b.value == lo->value && b.exclusive)) lo = b;
    };
    const auto tighter_hi = [&](jv::Bound b) {
      if (!hi || b.value < hi->value || (b.value == hi->value && b.exclusive)) hi = b;
    };
    const auto integral = [](double d) { return std::floor(d) == d; };
    if (mn) tighter_lo(jv::Bound{static_cast<int64_t>(std::ceil(*mn)), false});
    if (xmn) {
      tighter_lo(integral(*xmn) ? jv::Bound{static_cast<int64_t>(*xmn), true}
                                : jv::Bound{static_cast<int64_t>(std::ceil(*xmn)), false});
    }
    if (mx) tighter_hi(jv::Bound{static_cast<int64_t>(std::floor(*mx)), false});
    if (xmx) {
      tighter_hi(integral(*xmx) ? jv::Bound{static_cast<int64_t>(*xmx), true}
                                : jv::Bound{static_cast<int64_t>(std::floor(*xmx)), false});
    }
    if (!lo && !hi) return jv::Number();
    return jv::NumberRange(lo, hi);
  }

  absl::StatusOr<Expr> Object(const Json& s, const std::string& ptr, int depth) {
    const Json empty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) return Error(ptr, "'properties' must be an object");
    std::vector<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(ptr, "'required' must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Error(ptr, "'required' must list strings");
        if (std::find(required.begin(), required.end(), r.get<std::string>()) == required.end()) {
          required.push_back(r.get<std::string>());
        }
      }
    }
    const Json addl = s.contains("additionalProperties") ? s["additionalProperties"] : Json(!options_.strict);
    const bool addl_none = addl.is_boolean() && !addl.get<bool>();
    if (props.empty() && required.empty() && addl.is_boolean() && addl.get<bool>()) {
      uses_shared_ = true;
      return Expr::Ref(jv::kObjectRule);
    }
    struct Member {
      std::string name;
      Expr value;
      bool required;
    };
    std::vector<Member> members;
    std::vector<std::string> names;
    for (auto it = props.begin(); it != props.end(); ++it) {
      absl::StatusOr<Expr> v =
          Named(it.value(), absl::StrCat(ptr, "/properties/", EscapePointerToken(it.key())), depth + 1);
      if (!v.ok()) return v;
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      members.push_back({it.key(), *std::move(v), req});
      names.push_back(it.key());
    }
    std::optional<Expr> addl_value;
    if (!addl_none) {
      absl::StatusOr<Expr> v = Named(addl, ptr + "/additionalProperties", depth + 1);
      if (!v.ok()) return v;
      addl_value = *std::move(v);
    }
    for (const std::string& r : required) {
      if (std::find(names.begin(), names.end(), r) != names.end()) continue;
      if (!addl_value) {
        return Error(ptr, absl::StrCat("required property '", r,
                                       "' is not in 'properties' and 'additionalProperties' is false"));
      }
      members.push_back({r, *addl_value, true});
      names.push_back(r);
    }
    const Expr item_sep = Expr::Literal(sep_.item);
    const auto kv = [&](const Member& m) {
      return Expr::Sequence({Expr::Literal(jv::QuoteString(m.name) + sep_.key), m.value});
    };
    std::optional<Expr> addl_kv;
    if (addl_value) {
      addl_kv = Expr::Sequence({Expr::Literal("\""), jv::ContentNotIn(names), Expr::Literal("\"" + sep_.key),
                                *addl_value});
    }
    // F(i): members from i on, none written yet; R(i): members from i on after some.
    const size_t n = members.size();
    const std::string base = NewName(ptr + "/members");
    std::vector<std::optional<std::string>> f_rule(n + 1), r_rule(n + 1);
    std::function<Expr(size_t)> f_body, r_body;
    std::function<Expr(size_t)> f_ref = [&](size_t i) {
      if (!f_rule[i]) {
        f_rule[i] = absl::StrCat(base, "/F", i);
        builder_.AddRule(*f_rule[i], f_body(i));
      }
      return Expr::Ref(*f_rule[i]);
    };
    std::function<Expr(size_t)> r_ref = [&](size_t i) {
      if (!r_rule[i]) {
        r_rule[i] = absl::StrCat(base, "/R", i);
        builder_.AddRule(*r_rule[i], r_body(i));
      }
      return Expr::Ref(*r_rule[i]);
    };
    r_body = [&](size_t i) -> Expr {
      if (i == n) return addl_kv ? Expr::Star(Expr::Sequence({item_sep, *addl_kv})) : Expr::Empty();
      const Expr one = Expr::Sequence({item_sep, kv(members[i])});
      if (members[i].required) return Expr::Sequence({one, r_ref(i + 1)});
      return Expr::Sequence({Expr::Optional(one), r_ref(i + 1)});
    };
    f_body = [&](size_t i) -> Expr {
      if (i == n) {
        return addl_kv ? Expr::Optional(Expr::Sequence({*addl_kv, Expr::Star(Expr::Sequence({item_sep, *addl_kv}))}))
                       : Expr::Empty();
      }
      const Expr first = Expr::Sequence({kv(members[i]), r_ref(i + 1)});
      if (members[i].required) return first;
      return Expr::Choice({first, f_ref(i + 1)});
    };
    return Expr::Sequence({Expr::Literal("{"), f_body(0), Expr::Literal("}")});
  }

  absl::StatusOr<Expr> Array(const Json& s, const std::string& ptr, int depth) {
    std::vector<Expr> prefix;
    if (s.contains("prefixItems")) {
      const Json& p = s["prefixItems"];
      if (!p.is_array()) return Error(ptr, "'prefixItems' must be an array");
      for (size_t i = 0; i < p.size(); ++i) {
        absl::StatusOr<Expr> e = Named(p[i], absl::StrCat(ptr, "/prefixItems/", i), depth + 1);
        if (!e.ok()) return e;
        prefix.push_back(*std::move(e));
      }
    }
    const Json items = s.contains("items") ? s["items"] : Json(true);
    if (items.is_array()) {
      return Error(ptr, "'items' as an array (draft 2019-09 and earlier) is not supported: use 'prefixItems'");
    }
    std::optional<Expr> item;
    if (!(items.is_boolean() && !items.get<bool>())) {
      absl::StatusOr<Expr> e = Named(items, ptr + "/items", depth + 1);
      if (!e.ok()) return e;
      item = *std::move(e);
    }
    int min = 0;
    std::optional<int> max;
    if (s.contains("minItems")) {
      absl::StatusOr<int> v = Count(s, "minItems", ptr);
      if (!v.ok()) return v.status();
      min = *v;
    }
    if (s.contains("maxItems")) {
      absl::StatusOr<int> v = Count(s, "maxItems", ptr);
      if (!v.ok()) return v.status();
      max = *v;
    }
    const int k = static_cast<int>(prefix.size());
    if (!item) max = max ? std::min(*max, k) : k;
    if (max && min > *max) return Expr::Class({}, false);
    const Expr sep = Expr::Literal(sep_.item);
    const auto elem = [&](int i) { return i < k ? prefix[i] : *item; };
    // Elements from index i on, i >= 1 written.
    std::function<Expr(int)> rest = [&](int i) -> Expr {
      if (i >= k) {
        if (!item) return Expr::Empty();
        const int lo = std::max(min - i, 0);
        const int hi = max ? *max - i : -1;
        return Expr::Repeat(Expr::Sequence({sep, *item}), lo, hi);
      }
      std::vector<Expr> alts;
      if (i >= min) alts.push_back(Expr::Empty());
      if (!max || i < *max) alts.push_back(Expr::Sequence({sep, elem(i), rest(i + 1)}));
      return Expr::Choice(std::move(alts));
    };
    std::vector<Expr> body;
    if (min == 0) body.push_back(Expr::Empty());
    if ((!max || *max >= 1) && (k > 0 || item)) body.push_back(Expr::Sequence({elem(0), rest(1)}));
    return Expr::Sequence({Expr::Literal("["), Expr::Choice(std::move(body)), Expr::Literal("]")});
  }

  const Json& root_;
  JsonSchemaOptions options_;
  jv::Separators sep_;
  GrammarBuilder& builder_;
  const std::string rule_;
  const std::string prefix_;
  absl::flat_hash_map<std::string, std::string> ref_rules_;
  absl::flat_hash_set<std::string> used_names_;
  bool uses_shared_ = false;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  GrammarBuilder builder;
  if (absl::Status s = Converter(schema, options, &builder, "root", "").AddRules(); !s.ok()) return s;
  absl::StatusOr<Grammar> g = std::move(builder).Build("root");
  if (!g.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("json schema: ", std::string(g.status().message()),
                                                   " (a schema or sub-schema accepts no value)"));
  }
  return g;
}

absl::Status AddJsonSchemaRule(std::string_view name, std::string_view schema, const JsonSchemaOptions& options,
                               GrammarBuilder* builder) {
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("json schema: not valid JSON");
  if (builder->HasRule(name)) {
    return absl::InvalidArgumentError(absl::StrCat("json schema rule '", std::string(name), "': defined twice"));
  }
  return Converter(parsed, options, builder, std::string(name), std::string(name)).AddRules();
}

absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema, const JsonSchemaOptions& options) {
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("json schema: not valid JSON");
  return JsonSchemaToGrammar(parsed, options);
}

Grammar JsonObjectGrammar(const JsonSchemaOptions& options) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::ordered_json{{"type", "object"}}, options);
  return *std::move(g);
}

}  // namespace tandem::grammar
