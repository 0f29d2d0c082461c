#include "engine/model/rank_step.h"

#include <cstring>

#include "absl/status/status.h"

namespace tandem {
namespace {

enum Flag : uint8_t {
  kAllLogits = 1,
  kNoLogits = 2,
  kMtp = 4,
  kKeepHidden = 8,
  kFirstKvCached = 16,
};

template <typename T>
void Put(std::vector<std::byte>& out, const T& v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(&out[at], &v, sizeof(T));
}

void PutInts(std::vector<std::byte>& out, std::span<const int32_t> v) {
  Put<int64_t>(out, static_cast<int64_t>(v.size()));
  const size_t at = out.size();
  out.resize(at + v.size_bytes());
  if (!v.empty()) std::memcpy(&out[at], v.data(), v.size_bytes());
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    if (in_.size() - at_ < sizeof(T)) return false;
    std::memcpy(&v, &in_[at_], sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetInts(std::vector<int32_t>& v) {
    int64_t n = 0;
    if (!Get(n) || n < 0 || static_cast<uint64_t>(n) > (in_.size() - at_) / sizeof(int32_t)) return false;
    v.resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), &in_[at_], v.size() * sizeof(int32_t));
    at_ += v.size() * sizeof(int32_t);
    return true;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  size_t at_ = 0;
};

}  // namespace

std::vector<std::byte> EncodeRankStep(std::span<const ForwardSequence> batch, int64_t kv_blocks) {
  std::vector<std::byte> out;
  Put<int64_t>(out, kv_blocks);
  Put<int64_t>(out, static_cast<int64_t>(batch.size()));
  for (const ForwardSequence& s : batch) {
    const uint8_t flags = (s.all_logits ? kAllLogits : 0) | (s.no_logits ? kNoLogits : 0) | (s.mtp ? kMtp : 0) |
                          (s.keep_hidden ? kKeepHidden : 0) | (s.first_kv_cached ? kFirstKvCached : 0);
    Put(out, flags);
    Put(out, s.start_position);
    Put(out, s.state_slot);
    Put(out, s.mtp_next_token);
    Put(out, s.num_drafts);
    Put(out, s.dp_rank);
    PutInts(out, s.tokens);
    PutInts(out, s.block_table);
  }
  return out;
}

absl::StatusOr<RankStep> DecodeRankStep(std::span<const std::byte> bytes) {
  RankStep plan;
  Reader in(bytes);
  int64_t n = 0;
  const auto malformed = [] { return absl::InvalidArgumentError("a malformed step plan"); };
  if (!in.Get(plan.kv_blocks) || !in.Get(n) || n < 0 || static_cast<uint64_t>(n) > bytes.size()) {
    return malformed();
  }
  plan.tokens.resize(static_cast<size_t>(n));
  plan.block_tables.resize(static_cast<size_t>(n));
  plan.batch.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ForwardSequence& s = plan.batch[i];
    uint8_t flags = 0;
    if (!in.Get(flags) || !in.Get(s.start_position) || !in.Get(s.state_slot) || !in.Get(s.mtp_next_token) ||
        !in.Get(s.num_drafts) || !in.Get(s.dp_rank) ||
        !in.GetInts(plan.tokens[i]) || !in.GetInts(plan.block_tables[i])) {
      return malformed();
    }
    s.all_logits = flags & kAllLogits;
    s.no_logits = flags & kNoLogits;
    s.mtp = flags & kMtp;
    s.keep_hidden = flags & kKeepHidden;
    s.first_kv_cached = flags & kFirstKvCached;
    s.tokens = plan.tokens[i];
    s.block_table = plan.block_tables[i];
  }
  if (!in.done()) return malformed();
  return plan;
}

}  // namespace tandem
