#include "services/security/api_keys_file.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace tandem::security {
namespace {

constexpr size_t kMinKeyLength = 16;

bool Printable(absl::string_view s) {
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<ApiKey>> ParseApiKeys(std::string_view text, const std::string& origin) {
  std::vector<ApiKey> keys;
  std::set<std::string> seen_keys, seen_names;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("--api-keys-file ", origin, " line ", line_no, ": ", why));
    };
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    ApiKey k;
    k.key = std::string(fields[0]);
    if (k.key.size() < kMinKeyLength) {
      return error(absl::StrCat("the key has ", k.key.size(), " characters; at least ", kMinKeyLength,
                                " are required"));
    }
    if (!Printable(k.key)) return error("the key must be printable ASCII");
    if (k.key.find('=') != std::string::npos) return error("the first field must be the key (it has an '=')");
    bool burst_given = false;
    for (size_t i = 1; i < fields.size(); ++i) {
      absl::string_view f = fields[i];
      const size_t eq = f.find('=');
      if (eq == absl::string_view::npos) {
        return error(absl::StrCat("field '", f, "': expected name=, rps= or burst="));
      }
      const absl::string_view field = f.substr(0, eq), value = f.substr(eq + 1);
      if (field == "name") {
        if (value.empty() || !Printable(value)) return error("name: empty or not printable");
        k.name = std::string(value);
      } else if (field == "rps" || field == "burst") {
        double v = 0;
        if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < 0 || v > 1e9) {
          return error(absl::StrCat(field, ": '", value, "' is not a number in [0, 1e9]"));
        }
        if (field == "rps") {
          k.rps = v;
        } else {
          if (v < 1) return error("burst: must be at least 1");
          k.burst = v;
          burst_given = true;
        }
      } else {
        return error(absl::StrCat("unknown field '", field, "' (known: name, rps, burst)"));
      }
    }
    if (burst_given && k.rps == 0) return error("burst: needs rps");
    if (k.rps > 0 && !burst_given) k.burst = std::max(1.0, k.rps);
    if (k.name.empty()) k.name = absl::StrCat("key-", line_no);
    if (!seen_keys.insert(k.key).second) return error("the same key appears on an earlier line");
    if (!seen_names.insert(k.name).second) return error(absl::StrCat("name '", k.name, "' is used twice"));
    keys.push_back(std::move(k));
  }
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat("--api-keys-file ", origin, ": holds no key"));
  return keys;
}

absl::StatusOr<std::vector<ApiKey>> LoadApiKeysFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--api-keys-file: cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseApiKeys(ss.str(), path);
}

}  // namespace tandem::security
