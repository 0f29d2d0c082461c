#include "engine/runtime/kv_leases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"

namespace tandem {

absl::StatusOr<KvLeases::Reservation> KvLeases::Reserve(const std::string& id, int32_t num_blocks, int32_t num_tokens,
                                                        double now, int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ContainsLocked(id)) return absl::InvalidArgumentError(absl::StrCat("request id '", id, "' is already in use"));
  TANDEM_CHECK(rank >= 0 && rank < static_cast<int32_t>(pools_.size())) << "rank " << rank;
  BlockManager& blocks = *pools_[rank];
  absl::StatusOr<std::vector<int32_t>> got = blocks.Allocate(num_blocks);
  if (!got.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ReserveKv: ", num_blocks, " KV blocks needed, ", blocks.num_free(), " free",
                     pools_.size() > 1 ? absl::StrCat(" on rank ", rank) : "",
                     quarantined_blocks_ > 0 ? absl::StrCat(" (", quarantined_blocks_, " quarantined)") : ""));
  }
  int32_t slot = -1;
  if (slots_ != nullptr && (slot = slots_->Take()) < 0) {
    blocks.Release(*got);
    return absl::ResourceExhaustedError(absl::StrCat("ReserveKv: no sequence slot free (", slots_->size(),
                                                     " slots for rings and states, all held)"));
  }
  if (next_token_ == 0) ++next_token_;
  const uint64_t token = next_token_++;
  Held& h = live_[id];
  h = {.r = {.blocks = *got, .num_tokens = num_tokens, .token = token, .state_slot = slot, .rank = rank},
       .until = now + lease_seconds_};
  return h.r;
}

void KvLeases::Free(const Reservation& r) {
  pools_[r.rank]->Release(r.blocks);
  if (r.state_slot >= 0) slots_->Release(r.state_slot);
}

const KvLeases::Reservation* KvLeases::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second.r;
}

bool KvLeases::AnyOpen(const Held& h) {
  return std::any_of(h.writers.begin(), h.writers.end(), [](const Writer& w) { return w.open > 0; });
}

KvLeases::Writer* KvLeases::FindWriter(Held& h, uint64_t incarnation) {
  for (Writer& w : h.writers) {
    if (w.w.incarnation == incarnation) return &w;
  }
  return nullptr;
}

KvLeases::Held* KvLeases::Lookup(const std::string& id, uint64_t token, bool* quarantined) {
  for (Leases* m : {&live_, &quarantined_}) {
    auto it = m->find(id);
    if (it != m->end() && (token == 0 || it->second.r.token == token)) {
      *quarantined = m == &quarantined_;
      return &it->second;
    }
  }
  return nullptr;
}

absl::Status KvLeases::BeginWrites(const std::string& id, uint64_t token, const KvWriter& writer) {
  if (writer.address.empty() || writer.incarnation == 0) {
    return absl::InvalidArgumentError("BeginWrites: the writer's address and incarnation are required");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end() || it->second.r.token != token) {
    counts_.writers_refused++;
    return absl::FailedPreconditionError(
        absl::StrCat("lease '", id, "' is not live (expired, released, used or never made): write nothing into it"));
  }
  Held& h = it->second;
  if (Writer* w = FindWriter(h, writer.incarnation)) {
    w->open++;
  } else {
    h.writers.push_back({.w = writer, .open = 1});
  }
  return absl::OkStatus();
}

void KvLeases::EndWrites(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof) {
  std::lock_guard<std::mutex> lock(mu_);
  bool quarantined = false;
  Held* h = Lookup(id, token, &quarantined);
  if (h == nullptr) return;
  Writer* w = FindWriter(*h, incarnation);
  if (w == nullptr || w->open == 0) return;
  w->open--;
  if (quarantined) MaybeEndQuarantine(quarantined_.find(id), proof);
}

void KvLeases::WriterStopped(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof) {
  std::lock_guard<std::mutex> lock(mu_);
  bool quarantined = false;
  Held* h = Lookup(id, token, &quarantined);
  if (h == nullptr) return;
  Writer* w = FindWriter(*h, incarnation);
  if (w == nullptr || w->open == 0) return;
  w->open = 0;
  if (quarantined) MaybeEndQuarantine(quarantined_.find(id), proof);
}

absl::StatusOr<KvLeases::Reservation> KvLeases::Take(const std::string& id, uint64_t ended_writer, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no live KV reservation '", id, "' (expired or never made)"));
  }
  if (Writer* w = FindWriter(it->second, ended_writer); w != nullptr && w->open > 0) w->open--;
  if (AnyOpen(it->second)) {
    // Another writer (an earlier prefill of this lease, cut off) may still be writing:
    // these blocks cannot be decoded from, nor given to anyone, until it is known to stop.
    EndLive(it, now);
    return absl::FailedPreconditionError(absl::StrCat(
        "KV reservation '", id, "' has another writer that may still be writing into it (quarantined)"));
  }
  Reservation r = std::move(it->second.r);
  live_.erase(it);
  return r;
}

bool KvLeases::Release(const std::string& id, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = live_.find(id); it != live_.end()) {
    EndLive(it, now);
    return true;
  }
  return quarantined_.contains(id);
}

void KvLeases::EndLive(Leases::iterator it, double now) {
  if (!AnyOpen(it->second)) {
    Free(it->second.r);
    live_.erase(it);
    return;
  }
  auto node = live_.extract(it);
  Held& h = node.mapped();
  h.since = now;
  quarantined_blocks_ += static_cast<int64_t>(h.r.blocks.size());
  std::vector<KvWriter> open;
  for (const Writer& w : h.writers) {
    if (w.open > 0) open.push_back(w.w);
  }
  const std::string id = node.key();
  const uint64_t token = h.r.token;
  quarantined_.insert(std::move(node));
  if (listener_ != nullptr) listener_->OnQuarantined(id, token, open);
}

void KvLeases::MaybeEndQuarantine(Leases::iterator it, KvWriterProof proof) {
  if (it == quarantined_.end() || AnyOpen(it->second)) return;
  Free(it->second.r);
  quarantined_blocks_ -= static_cast<int64_t>(it->second.r.blocks.size());
  switch (proof) {
    case KvWriterProof::kEnded: counts_.ends_writer_ended++; break;
    case KvWriterProof::kGone: counts_.ends_writer_gone++; break;
    case KvWriterProof::kDecoded: counts_.ends_decoded++; break;
  }
  const std::string id = it->first;
  const uint64_t token = it->second.r.token;
  quarantined_.erase(it);
  if (listener_ != nullptr) listener_->OnQuarantineEnded(id, token);
}

void KvLeases::Tick(double now) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, h] : quarantined_) {
    if (!h.stuck && h.since + stuck_seconds_ <= now) h.stuck = true;
  }
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.until > now) {
      ++it;
      continue;
    }
    counts_.expired++;
    if (!AnyOpen(it->second)) counts_.ends_no_writer++;
    EndLive(it++, now);
  }
}

double KvLeases::NextDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  double next = std::numeric_limits<double>::infinity();
  for (const auto& [id, h] : live_) next = std::min(next, h.until);
  for (const auto& [id, h] : quarantined_) {
    if (!h.stuck) next = std::min(next, h.since + stuck_seconds_);
  }
  return next;
}

void KvLeases::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, h] : live_) Free(h.r);
  for (auto& [id, h] : quarantined_) Free(h.r);
  live_.clear();
  quarantined_.clear();
  quarantined_blocks_ = 0;
}

KvLeaseStats KvLeases::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvLeaseStats s = counts_;
  s.quarantined_blocks = quarantined_blocks_;
  s.quarantined_leases = static_cast<int64_t>(quarantined_.size());
  s.quarantine_stuck = std::count_if(quarantined_.begin(), quarantined_.end(), [](const auto& e) { return e.second.stuck; });
  return s;
}

}  // namespace tandem
