#include "engine/model/kv_streams.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {

const char* KvGranularityName(KvGranularity g) {
  switch (g) {
    case KvGranularity::kPerToken: return "per token";
    case KvGranularity::kPerWindow: return "per window";
    case KvGranularity::kRing: return "ring";
    case KvGranularity::kSequenceState: return "sequence state";
  }
  return "unknown";
}

int64_t KvDtypeBytes(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16") return 2;
  if (dtype == "fp8_e4m3") return 1;
  return 0;
}

bool IsPaged(const KvStream& s) {
  return s.granularity == KvGranularity::kPerToken || s.granularity == KvGranularity::kPerWindow;
}

int64_t EntriesPerBlock(const KvStream& s, int32_t block_size) {
  if (s.granularity == KvGranularity::kPerToken) return block_size;
  if (s.granularity != KvGranularity::kPerWindow || s.tokens <= 0) return 0;
  return s.tokens <= block_size ? block_size / s.tokens : 1;
}

absl::Status ValidateKvStreams(const std::vector<KvStream>& streams, int32_t num_layers, int32_t block_size) {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV block size ", block_size, " is not positive"));
  }
  if (streams.empty()) return absl::InvalidArgumentError("the KV layout has no streams");
  std::set<std::string> names;
  for (const KvStream& s : streams) {
    const std::string who = absl::StrCat("KV stream '", s.name, "': ");
    if (s.name.empty()) return absl::InvalidArgumentError("a KV stream has no name");
    if (!names.insert(s.name).second) return absl::InvalidArgumentError(absl::StrCat(who, "named twice"));
    if (KvDtypeBytes(s.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(who, "unknown dtype '", s.dtype, "'"));
    }
    if (s.width <= 0) return absl::InvalidArgumentError(absl::StrCat(who, "width ", s.width, " is not positive"));
    if (s.tokens <= 0) return absl::InvalidArgumentError(absl::StrCat(who, "tokens ", s.tokens, " is not positive"));
    switch (s.granularity) {
      case KvGranularity::kPerToken:
        if (s.tokens != 1) return absl::InvalidArgumentError(absl::StrCat(who, "a per-token stream has tokens 1"));
        break;
      case KvGranularity::kPerWindow:
        if (s.tokens <= block_size ? block_size % s.tokens != 0 : s.tokens % block_size != 0) {
          return absl::InvalidArgumentError(absl::StrCat(who, "windows of ", s.tokens,
                                                         " tokens neither divide nor are a multiple of the ",
                                                         block_size, "-token block"));
        }
        break;
      case KvGranularity::kRing:
      case KvGranularity::kSequenceState:
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(who, "unknown granularity ", static_cast<int32_t>(s.granularity)));
    }
    if (s.layers.empty()) return absl::InvalidArgumentError(absl::StrCat(who, "on no layer"));
    for (size_t i = 0; i < s.layers.size(); ++i) {
      if (s.layers[i] < 0 || s.layers[i] >= num_layers) {
        return absl::InvalidArgumentError(absl::StrCat(who, "layer ", s.layers[i], " outside 0..", num_layers - 1));
      }
      if (i > 0 && s.layers[i] <= s.layers[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(who, "layers not ascending and unique"));
      }
    }
  }
  return absl::OkStatus();
}

int64_t PagedBytesPerBlock(const std::vector<KvStream>& streams, int32_t block_size) {
  int64_t bytes = 0;
  for (const KvStream& s : streams) {
    if (!IsPaged(s)) continue;
    bytes += static_cast<int64_t>(s.layers.size()) * EntriesPerBlock(s, block_size) * s.width * KvDtypeBytes(s.dtype);
  }
  return bytes;
}

int64_t SequenceStateBytes(const std::vector<KvStream>& streams) {
  int64_t bytes = 0;
  for (const KvStream& s : streams) {
    if (IsPaged(s)) continue;
    bytes += static_cast<int64_t>(s.layers.size()) * s.tokens * s.width * KvDtypeBytes(s.dtype);
  }
  return bytes;
}

std::string DescribeKvStreams(const std::vector<KvStream>& streams) {
  std::vector<std::string> parts;
  for (const KvStream& s : streams) {
    std::string what = KvGranularityName(s.granularity);
    if (s.granularity != KvGranularity::kPerToken) absl::StrAppend(&what, " of ", s.tokens);
    parts.push_back(absl::StrCat(s.name, ": ", what, " x ", s.width, " ", s.dtype, " on ", s.layers.size(), " layers"));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace tandem
