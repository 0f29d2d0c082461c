// The engine's decode side of disaggregation (engine.h): KV reservations (leases, their
// writers, waiting for room), writes into them, and the admission of a request whose
// prompt KV was written there (SubmitImported).
#include <algorithm>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"

namespace tandem {

void Engine::ReleaseKv(const std::string& id, uint64_t ended_writer) {
  Post([this, id, ended_writer] {
    if (ended_writer != 0) leases_->EndWrites(id, 0, ended_writer, KvWriterProof::kDecoded);
    leases_->Release(id, Now());
  });
}

void Engine::BeginKvWrites(const std::string& id, uint64_t token, KvWriter writer,
                           std::function<void(absl::Status)> done) {
  // On the caller's thread: the writer waits for this answer, which must not wait for the
  // step in flight (kv_leases.h).
  done(leases_->BeginWrites(id, token, writer));
}

void Engine::EndKvWrites(const std::string& id, uint64_t token, uint64_t incarnation) {
  Post([this, id, token, incarnation] { leases_->EndWrites(id, token, incarnation, KvWriterProof::kEnded); });
}

void Engine::KvWriterStopped(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof) {
  Post([this, id, token, incarnation, proof] { leases_->WriterStopped(id, token, incarnation, proof); });
}

void Engine::SetKvQuarantineListener(KvQuarantineListener* listener) {
  // KvLeases calls its listener under its lock: once this returns, the old one is done with.
  leases_->set_listener(listener);
}

absl::StatusOr<std::vector<int32_t>> Engine::ReserveKv(const std::string& id, int32_t num_tokens) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<std::vector<int32_t>>>>();
  auto future = promise->get_future();
  ReserveKvAsync(id, num_tokens, /*wait_s=*/0, [promise](absl::StatusOr<KvLeases::Reservation> r) {
    if (r.ok()) promise->set_value(std::move(r->blocks));
    else promise->set_value(r.status());
  });
  return future.get();
}

void Engine::ReserveKvAsync(const std::string& id, int32_t num_tokens, double wait_s, ReserveDone done) {
  if (num_tokens <= 0) return done(absl::InvalidArgumentError("ReserveKv: num_tokens must be positive"));
  if (num_tokens >= backend_->config().max_position_embeddings) {
    return done(absl::InvalidArgumentError(absl::StrCat("ReserveKv: ", num_tokens, " tokens exceed the model's context")));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return done(absl::UnavailableError("engine is shutting down"));
    if (live_ids_.contains(id)) {
      return done(absl::InvalidArgumentError(absl::StrCat("request id '", id, "' is already in use")));
    }
  }
  Post([this, id, num_tokens, wait_s, done = std::move(done)]() mutable {
    counters_.kv_reserve_requests++;
    const bool waiting_id = std::any_of(kv_waiters_.begin(), kv_waiters_.end(), [&](const KvWaiter& w) { return w.id == id; });
    if (waiting_id || leases_->Contains(id) || scheduler_->Find(id) != nullptr) {
      done(absl::InvalidArgumentError(absl::StrCat("request id '", id, "' is already in use")));
      return;
    }
    const int32_t need = scheduler_->BlocksFor(static_cast<int64_t>(num_tokens) + 1);
    if (need > scheduler_->blocks().num_blocks()) {
      // Waiting cannot help: a distinct code, so that the router fails the request at once
      // rather than waiting for room that will never appear.
      done(absl::OutOfRangeError(absl::StrCat("ReserveKv: ", num_tokens, " tokens need ", need,
                                              " KV blocks, more than this replica's whole KV pool (",
                                              scheduler_->blocks().num_blocks(), " blocks",
                                              scheduler_->num_pools() > 1 ? " per data-parallel rank" : "", ")")));
      return;
    }
    // First fit: a reservation that fits now is made now (waiting ones do not fit).
    absl::StatusOr<KvLeases::Reservation> blocks = ReserveNow(id, num_tokens);
    if (blocks.ok() || !absl::IsResourceExhausted(blocks.status()) || wait_s <= 0) {
      done(std::move(blocks));
      return;
    }
    if (static_cast<int64_t>(kv_waiters_.size()) >= options_.max_kv_waiters) {
      done(absl::ResourceExhaustedError(absl::StrCat("ReserveKv: no KV room, and the wait queue is full (",
                                                     options_.max_kv_waiters, " waiting)")));
      return;
    }
    kv_waiters_.push_back({id, num_tokens, Now() + wait_s, std::move(done)});
  });
}

absl::StatusOr<KvLeases::Reservation> Engine::ReserveNow(const std::string& id, int32_t num_tokens) {
  // One position more than the prompt: the first decode step writes there; with drafts,
  // the slots of the draft pass made at admission and of the first verify step.
  const int32_t need = scheduler_->BlocksFor(static_cast<int64_t>(num_tokens) + 1 +
                                             2 * int64_t{options_.speculative_tokens});
  if (scheduler_->PlaceReservation(need) < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("ReserveKv: ", need, " KV blocks needed, ", MostFreeOnARank(),
                                                     scheduler_->num_pools() > 1 ? " free on any rank" : " free"));
  }
  // Blocks freed while a step computes may still be written by it (a sequence that ended
  // meanwhile): the peer writing into the reservation must come after it.
  SettleInFlight();
  // With data-parallel ranks the KV goes straight into the blocks of the rank that will
  // hold the sequence (every rank's are blocks of the one pool the transport registered).
  return leases_->Reserve(id, need, num_tokens, Now(), scheduler_->PlaceReservation(need));
}

void Engine::AdmitKvWaiters() {
  if (kv_waiters_.empty()) return;
  const double now = Now();
  for (auto it = kv_waiters_.begin(); it != kv_waiters_.end();) {
    if (it->deadline <= now) {
      ReserveDone done = std::move(it->done);
      it = kv_waiters_.erase(it);
      done(absl::ResourceExhaustedError("ReserveKv: no KV room within the wait"));
    } else {
      ++it;
    }
  }
  // In arrival order, every waiter that fits now: a large reservation ahead waiting for
  // more room does not hold back smaller ones behind it (it keeps its place, and its wait
  // bounds how long it can be overtaken).
  for (auto it = kv_waiters_.begin(); it != kv_waiters_.end() && MostFreeOnARank() > 0;) {
    absl::StatusOr<KvLeases::Reservation> blocks = ReserveNow(it->id, it->num_tokens);
    if (!blocks.ok() && absl::IsResourceExhausted(blocks.status())) {
      ++it;
      continue;
    }
    ReserveDone done = std::move(it->done);
    it = kv_waiters_.erase(it);
    done(std::move(blocks));
  }
}

int32_t Engine::MostFreeOnARank() const {
  int32_t most = 0;
  for (int32_t r = 0; r < scheduler_->num_pools(); ++r) most = std::max(most, scheduler_->pool(r).num_free());
  return most;
}

absl::Status Engine::WriteKv(std::span<const int32_t> block_table, int64_t layer, int64_t first_position,
                             std::span<const float> entries) {
  const int64_t dim = kv_entry_dim();
  if (cache_ == nullptr) return absl::UnimplementedError("WriteKv: this model's KV has no latent stream");
  if (layer < 0 || layer >= cache_->num_layers()) return absl::InvalidArgumentError(absl::StrCat("WriteKv: layer ", layer, " out of range"));
  if (entries.size() % dim != 0) return absl::InvalidArgumentError("WriteKv: entries are not whole positions");
  const int64_t n = static_cast<int64_t>(entries.size()) / dim;
  if (first_position < 0 || first_position + n > static_cast<int64_t>(block_table.size()) * cache_->block_size()) {
    return absl::InvalidArgumentError("WriteKv: positions beyond the reserved blocks");
  }
  for (int32_t b : block_table) {
    if (b < 0 || b >= cache_->num_blocks()) return absl::InvalidArgumentError(absl::StrCat("WriteKv: block ", b, " out of range"));
  }
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(cache_->Entry(layer, block_table, first_position + i), entries.data() + i * dim, dim * sizeof(float));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<OutputStream>> Engine::SubmitImported(EngineRequest request, int32_t first_token,
                                                                     bool emit_first_token, ImportedKv where) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<std::shared_ptr<OutputStream>>>>();
  auto future = promise->get_future();
  SubmitImportedAsync(std::move(request), first_token, emit_first_token, where,
                      [promise](absl::StatusOr<std::shared_ptr<OutputStream>> r) { promise->set_value(std::move(r)); });
  return future.get();
}

void Engine::SubmitImportedAsync(EngineRequest request, int32_t first_token, bool emit_first_token, ImportedKv where,
                                 SubmitDone done) {
  const uint64_t kv_writer = request.kv_writer;
  // The writer's proof holds whatever becomes of the request: a refused one still ends it
  // (before `done`, so that a Cancel from `done` comes after).
  auto refuse = [&](absl::Status st) {
    if (kv_writer != 0) {
      Post([this, id = request.id, kv_writer] { leases_->EndWrites(id, 0, kv_writer, KvWriterProof::kDecoded); });
    }
    done(std::move(st));
  };
  if (absl::Status st = ValidateRequest(request); !st.ok()) return refuse(st);
  if (first_token < 0 || first_token >= backend_->config().vocab_size) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("first token ", first_token, " is outside the vocabulary")));
  }
  if (where == ImportedKv::kDevicePool && backend_->kv_in_host_pool()) {
    return refuse(absl::InvalidArgumentError("KV in a device pool, but the model runs on the CPU"));
  }
  if (options_.speculative_tokens > 0 &&
      static_cast<int64_t>(request.mtp_hidden.size()) != backend_->config().mtp_hidden_size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "mtp_hidden: ", request.mtp_hidden.size(), " values; this replica drafts with the MTP layer and needs the "
        "prompt's last hidden state from the prefill replica (", backend_->config().mtp_hidden_size(), " values)")));
  }
  auto out = std::make_shared<OutputStream>();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) {
      lock.unlock();
      return done(absl::UnavailableError("engine is shutting down"));
    }
    if (live_ids_.contains(request.id)) {
      lock.unlock();
      return refuse(absl::InvalidArgumentError(absl::StrCat("request id '", request.id, "' is already in use")));
    }
    live_ids_[request.id] = true;
  }
  const OutputConstraint constraint = std::move(request.constraint);
  std::vector<float> mtp_hidden = std::move(request.mtp_hidden);
  auto seq = std::make_shared<std::unique_ptr<Sequence>>(MakeSequence(std::move(request), out));
  (*seq)->speculative = Drafts((*seq)->kv_sink);
  if (options_.speculative_tokens > 0) (*seq)->imported_hidden = std::move(mtp_hidden);
  Post([this, seq, constraint, done = std::move(done), first_token, emit_first_token, where, kv_writer]() mutable {
    if (!constraint.active()) {
      AdmitImported(std::move(*seq), first_token, emit_first_token, where, kv_writer, std::move(done));
      return;
    }
    const std::string id = (*seq)->id;
    CompileThen(id, constraint, [this, seq, done = std::move(done), first_token, emit_first_token, where,
                                 kv_writer](Compiled g) mutable {
      absl::Status st = g.ok() ? AttachMatcher(**seq, *g) : g.status();
      if (st.ok() && !(*seq)->matcher->AcceptToken(first_token)) {
        st = absl::InvalidArgumentError(
            absl::StrCat("first token ", first_token, " does not satisfy the request's constraint"));
      }
      if (!st.ok()) {
        leases_->EndWrites((*seq)->id, 0, kv_writer, KvWriterProof::kDecoded);
        {
          std::lock_guard<std::mutex> lock(mu_);
          live_ids_.erase((*seq)->id);
        }
        done(std::move(st));
        return;
      }
      AdmitImported(std::move(*seq), first_token, emit_first_token, where, kv_writer, std::move(done));
    });
  });
}

void Engine::AdmitImported(std::unique_ptr<Sequence> seq_ptr, int32_t first_token, bool emit_first_token,
                           ImportedKv where, uint64_t kv_writer, SubmitDone done) {
  std::shared_ptr<OutputStream> out = seq_ptr->output;
  Sequence& s = *seq_ptr;
  {
    const int32_t have = static_cast<int32_t>(s.tokens.size());  // prompt + resumed output
    const KvLeases::Reservation* live = leases_->Find(s.id);
    absl::StatusOr<KvLeases::Reservation> taken;
    if (live == nullptr || live->num_tokens < have) {
      leases_->EndWrites(s.id, 0, kv_writer, KvWriterProof::kDecoded);
      taken = absl::FailedPreconditionError(
          absl::StrCat("no KV reservation of ", have, " tokens for request '", s.id, "' (expired or never made)"));
    } else {
      taken = leases_->Take(s.id, kv_writer, Now());
    }
    if (!taken.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        live_ids_.erase(s.id);
      }
      done(taken.status());
      return;
    }
    s.blocks = std::move(taken->blocks);
    s.dp_rank = taken->rank;  // the rank whose blocks the KV was written into
    s.state_slot = taken->state_slot;  // its rings and states were written there
    s.num_computed = have;
    s.host_kv_upload_end = backend_->kv_in_host_pool() || where == ImportedKv::kDevicePool ? 0 : have;
    s.prefix_looked_up = true;
    s.first_scheduled_at = s.first_token_at = Now();
    const StopResult r = s.stop->OnToken(first_token);
    s.tokens.push_back(first_token);
    RequestOutput o;
    o.token_ids.push_back(first_token);
    o.text = r.text_delta;
    o.metrics = s.metrics;
    done(out);
    if (r.finished) {
      if (!emit_first_token) {
        o.token_ids.clear();
        o.text.clear();
      }
      o.finished = true;
      o.finish_reason = r.reason;
      o.matched_stop = r.matched_stop;
      scheduler_->PoolOf(s).Release(s.blocks);
      s.blocks.clear();
      if (s.state_slot >= 0) scheduler_->state_slots().Release(s.state_slot);
      s.state_slot = -1;
      Finish(std::move(seq_ptr), std::move(o));
      return;
    }
    if (emit_first_token) s.output->Push(std::move(o));
    // Drafts for the first step, as an aggregated engine makes them after a prompt's last
    // chunk: the same drafts, so the same acceptance and the same seeded tokens.
    if (options_.speculative_tokens > 0 && !DraftAfterImport(seq_ptr)) return;
    scheduler_->AddRunning(std::move(seq_ptr));
    }
}

}  // namespace tandem
