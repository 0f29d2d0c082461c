// Typed reads of config.json's members, shared by every architecture's config parser: a
// JSON null counts as absent, and a member of the wrong type is INVALID_ARGUMENT
// "config.json: field 'NAME' ..." naming it (with `prefix` for nested objects).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/util/mapped_file.h"
#include "nlohmann/json.hpp"

namespace tandem {

inline absl::Status ConfigFieldError(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, "' ", problem));
}

class ConfigFields {
 public:
  using Json = nlohmann::json;
  // `obj` must outlive this reader.
  ConfigFields(const Json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const Json& At(const char* key) const { return obj_.at(key); }
  std::string Name(const char* key) const { return prefix_ + key; }

  // An integer, or a float of integral value (configs written by Python may hold 4.0).
  static absl::StatusOr<int64_t> AsInt(const Json& v, const std::string& name) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 9.0e18) {
      return static_cast<int64_t>(v.get<double>());
    }
    return ConfigFieldError(name, absl::StrCat("must be an integer, got ", v.dump()));
  }
  absl::StatusOr<std::optional<int64_t>> Int(const char* key) const {
    if (!Has(key)) return std::optional<int64_t>();
    absl::StatusOr<int64_t> v = AsInt(obj_.at(key), Name(key));
    if (!v.ok()) return v.status();
    return std::optional<int64_t>(*v);
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t fallback) const {
    absl::StatusOr<std::optional<int64_t>> v = Int(key);
    if (!v.ok()) return v.status();
    return v->value_or(fallback);
  }
  absl::StatusOr<int64_t> RequiredInt(const char* key) const {
    absl::StatusOr<std::optional<int64_t>> v = Int(key);
    if (!v.ok()) return v.status();
    if (!*v) return ConfigFieldError(Name(key), "is required");
    return **v;
  }
  absl::StatusOr<std::optional<double>> Double(const char* key) const {
    if (!Has(key)) return std::optional<double>();
    const Json& v = obj_.at(key);
    if (!v.is_number()) return ConfigFieldError(Name(key), absl::StrCat("must be a number, got ", v.dump()));
    const double d = v.get<double>();
    if (!std::isfinite(d)) return ConfigFieldError(Name(key), "must be finite");
    return std::optional<double>(d);
  }
  absl::StatusOr<double> Double(const char* key, double fallback) const {
    absl::StatusOr<std::optional<double>> v = Double(key);
    if (!v.ok()) return v.status();
    return v->value_or(fallback);
  }
  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const Json& v = obj_.at(key);
    if (!v.is_boolean()) return ConfigFieldError(Name(key), absl::StrCat("must be true or false, got ", v.dump()));
    return v.get<bool>();
  }
  absl::StatusOr<std::optional<std::string>> String(const char* key) const {
    if (!Has(key)) return std::optional<std::string>();
    const Json& v = obj_.at(key);
    if (!v.is_string()) return ConfigFieldError(Name(key), absl::StrCat("must be a string, got ", v.dump()));
    return std::optional<std::string>(v.get<std::string>());
  }
  // An integer or a list of integers (as eos_token_id is written), as a list.
  absl::StatusOr<std::optional<std::vector<int64_t>>> IntList(const char* key) const {
    if (!Has(key)) return std::optional<std::vector<int64_t>>();
    const Json& v = obj_.at(key);
    std::vector<int64_t> out;
    if (v.is_number_integer()) {
      out.push_back(v.get<int64_t>());
    } else if (v.is_array()) {
      for (const Json& item : v) {
        if (!item.is_number_integer()) return ConfigFieldError(Name(key), "must be an integer or a list of integers");
        out.push_back(item.get<int64_t>());
      }
    } else {
      return ConfigFieldError(Name(key), "must be an integer or a list of integers");
    }
    return std::optional<std::vector<int64_t>>(std::move(out));
  }

 private:
  const Json& obj_;
  std::string prefix_;
};

// Reads DIR/config.json and parses it with `parse` (text -> StatusOr<Config>); errors
// name the file.
template <typename Parse>
auto LoadConfigFile(const std::string& dir, Parse parse) -> decltype(parse(std::string())) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto config = parse(*text);
  if (!config.ok()) return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  return config;
}

}  // namespace tandem
