#include "services/decode/kv_writer_prober.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace tandem {

KvWriterProber::KvWriterProber(WriterStateClient* client, OnProof on_proof, KvWriterProberOptions options)
    : client_(client), on_proof_(std::move(on_proof)), options_(options), thread_([this] { Loop(); }) {}

KvWriterProber::~KvWriterProber() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
    // The completions of asks in flight touch this object.
    cv_.wait(lock, [this] { return asks_in_flight_ == 0; });
  }
  thread_.join();
}

void KvWriterProber::OnQuarantined(const std::string& lease_id, uint64_t token, const std::vector<KvWriter>& open) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const LeaseKey key{lease_id, token};
  quarantines_.emplace(key, Quarantine{.since = now});
  for (const KvWriter& w : open) {
    Target& t = targets_[w.address];
    if (t.leases.empty() && !t.asking) {
      t.next = now + options_.first_ask;
      t.backoff = options_.first_ask;
    }
    t.leases[key].insert(w.incarnation);
  }
  news_ = true;
  cv_.notify_all();
}

void KvWriterProber::OnQuarantineEnded(const std::string& lease_id, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  const LeaseKey key{lease_id, token};
  quarantines_.erase(key);
  for (auto it = targets_.begin(); it != targets_.end();) {
    it->second.leases.erase(key);
    if (it->second.leases.empty() && !it->second.asking) it = targets_.erase(it);
    else ++it;
  }
}

size_t KvWriterProber::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [address, t] : targets_) {
    for (const auto& [key, incarnations] : t.leases) n += incarnations.size();
  }
  return n;
}

std::map<std::string, size_t> KvWriterProber::PendingByAddress() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, size_t> out;
  for (const auto& [address, t] : targets_) {
    size_t n = 0;
    for (const auto& [key, incarnations] : t.leases) n += incarnations.size();
    if (n > 0) out[address] = n;
  }
  return out;
}

void KvWriterProber::Ask(const std::string& address, Target& t) {
  v1::WriterStateRequest request;
  for (const auto& [key, incarnations] : t.leases) {
    v1::LeaseRef* l = request.add_leases();
    l->set_lease_id(key.id);
    l->set_lease_token(key.token);
  }
  t.asking = true;
  ++asks_in_flight_;
  auto asked = std::make_shared<std::map<LeaseKey, std::set<uint64_t>>>(t.leases);
  // The completion may run inline: it takes mu_, so the call is made without it.
  mu_.unlock();
  client_->Ask(address, request, [this, address, asked](absl::StatusOr<v1::WriterStateResponse> r) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back({address, std::move(*asked), std::move(r)});
    --asks_in_flight_;
    cv_.notify_all();
  });
  mu_.lock();
}

void KvWriterProber::Settle(Answer a, std::unique_lock<std::mutex>& lock, std::vector<Proof>* proofs) {
  bool gone = false;
  std::set<LeaseKey> writing;
  uint64_t answering = 0;
  if (a.response.ok()) {
    answering = a.response->incarnation();
    for (const v1::LeaseRef& l : a.response->writing()) writing.insert({l.lease_id(), l.lease_token()});
  } else {
    // A failed call proves nothing, unless nothing listens at the address any more.
    lock.unlock();
    gone = client_->NothingListens(a.address);
    lock.lock();
  }
  auto it = targets_.find(a.address);
  if (it == targets_.end()) return;
  Target& t = it->second;
  t.asking = false;
  for (const auto& [key, incarnations] : a.asked) {
    auto held = t.leases.find(key);
    if (held == t.leases.end()) continue;  // its quarantine ended meanwhile
    for (uint64_t inc : incarnations) {
      if (!held->second.contains(inc)) continue;
      std::optional<KvWriterProof> proof;
      if (gone) {
        proof = KvWriterProof::kGone;
      } else if (a.response.ok() && answering != inc) {
        proof = KvWriterProof::kGone;  // another process holds the writer's port
      } else if (a.response.ok() && !writing.contains(key)) {
        proof = KvWriterProof::kEnded;  // the writer itself: no writes held for the lease
      }
      if (!proof) continue;
      proofs->push_back({key, inc, *proof});
      held->second.erase(inc);
    }
    if (held->second.empty()) t.leases.erase(held);
  }
  if (t.leases.empty()) {
    targets_.erase(it);
    return;
  }
  t.backoff = std::min(options_.max_backoff, t.backoff * 2);
  t.next = Clock::now() + t.backoff;
}

void KvWriterProber::LogStuck(Clock::time_point now, Clock::time_point* wake) {
  for (auto& [key, q] : quarantines_) {
    if (q.logged) continue;
    const Clock::time_point at = q.since + options_.stuck_after;
    if (at > now) {
      *wake = std::min(*wake, at);
      continue;
    }
    q.logged = true;
    std::string writers;
    for (const auto& [address, t] : targets_) {
      auto held = t.leases.find(key);
      if (held == t.leases.end()) continue;
      for (uint64_t inc : held->second) writers += absl::StrFormat(" %s (incarnation %016x)", address, inc);
    }
    spdlog::warn("lease {} quarantined for {} s: its blocks stay out of use until these writers are known to have "
                 "stopped:{}",
                 key.id, std::chrono::duration_cast<std::chrono::seconds>(now - q.since).count(),
                 writers.empty() ? " (their proof is on its way)" : writers);
  }
}

void KvWriterProber::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    news_ = false;
    std::vector<Proof> proofs;
    while (!answers_.empty()) {
      Answer a = std::move(answers_.front());
      answers_.pop_front();
      Settle(std::move(a), lock, &proofs);
    }
    if (!proofs.empty()) {
      lock.unlock();
      for (const Proof& p : proofs) on_proof_(p.lease.id, p.lease.token, p.incarnation, p.proof);
      lock.lock();
      continue;  // answers may have come meanwhile
    }
    const Clock::time_point now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    LogStuck(now, &wake);
    for (auto& [address, t] : targets_) {
      if (t.asking || t.leases.empty()) continue;
      if (t.next <= now) {
        Ask(address, t);  // releases mu_ for the call: targets_ may change, restart the scan
        wake = now;
        break;
      }
      wake = std::min(wake, t.next);
    }
    if (wake <= now) continue;
    auto ready = [this] { return stop_ || news_ || !answers_.empty(); };
    if (wake == Clock::time_point::max()) cv_.wait(lock, ready);
    else cv_.wait_until(lock, wake, ready);
  }
}

}  // namespace tandem
