#include "engine/runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runtime/block_hash.h"
#include "engine/model/kv_pool.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "xxhash.h"

namespace tandem {
namespace {

// Copies the imported prefix blocks the scheduler allocated for `s` into the cache, then
// drops the import (its memory goes back to whoever fetched it).
int64_t CopyImportedPrefix(Sequence& s, LatentKvCache& cache) {
  const PrefixKv& p = *s.prefix_kv;
  const int64_t layer_floats = cache.block_size() * cache.entry_dim();
  for (int32_t b = s.import_begin; b < s.import_end; ++b) {
    const float* src = p.blocks[static_cast<size_t>(b - p.first_block)];
    for (int64_t layer = 0; layer < cache.num_layers(); ++layer) {
      std::span<float> dst = cache.Block(layer, s.blocks[static_cast<size_t>(b)]);
      std::memcpy(dst.data(), src + layer * layer_floats, static_cast<size_t>(layer_floats) * sizeof(float));
    }
  }
  const int64_t tokens = static_cast<int64_t>(s.import_end - s.import_begin) * cache.block_size();
  s.import_begin = s.import_end = 0;
  s.prefix_kv.reset();
  return tokens;
}


}  // namespace

int32_t DefaultMaxBatchTokens(const std::string& device) { return device.rfind("cuda", 0) == 0 ? 8192 : 2048; }

absl::Status Engine::ValidateRequest(const EngineRequest& r) const {
  RETURN_IF_ERROR(Validate(r.constraint));
  const ModelInfo& c = backend_->config();
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: empty (a request needs at least one token)");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", t, " is outside the vocabulary (size ",
                                                     c.vocab_size, ")"));
    }
  }
  for (int32_t t : r.resume_tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("resume_tokens: token id ", t, " is outside the vocabulary"));
    }
  }
  if (static_cast<int64_t>(r.prompt.size() + r.resume_tokens.size()) >= c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", r.prompt.size(),
                                                   " tokens leave no room to generate in the model's context of ",
                                                   c.max_position_embeddings, " tokens"));
  }
  RETURN_IF_ERROR(Validate(r.sampling, c.vocab_size));
  RETURN_IF_ERROR(Validate(r.stop, c.vocab_size));
  const int32_t need = scheduler_->BlocksFor(static_cast<int64_t>(r.prompt.size()) + 1);
  if (need > pool_->geometry().num_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat("prompt: ", r.prompt.size(), " tokens need ", need,
                                                     " KV cache blocks; the cache has ",
                                                     pool_->geometry().num_blocks));
  }
  if (r.id.empty()) return absl::InvalidArgumentError("request id: empty");
  if (!latent_layout_ && r.kv_sink != nullptr && !r.kv_sink->takes_sequence_kv()) {
    return absl::UnimplementedError(absl::StrCat("KV export by layer for a ", c.model_type, " model (its KV streams: ",
                                                 DescribeKvStreams(layout_.streams), ")"));
  }
  if (r.prefix_kv) {
    const PrefixKv& p = *r.prefix_kv;
    const int64_t usable = (static_cast<int64_t>(r.prompt.size()) - 1) / kKvBlockSize;
    if (p.first_block < 0 || p.blocks.size() != p.hashes.size() ||
        p.first_block + static_cast<int64_t>(p.hashes.size()) > usable) {
      return absl::InvalidArgumentError(absl::StrCat("prefix_kv: blocks [", p.first_block, ", ",
                                                     p.first_block + static_cast<int64_t>(p.hashes.size()),
                                                     ") do not fit the prompt's ", usable,
                                                     " full blocks before its last token"));
    }
    const std::vector<uint64_t> chain =
        HashFullBlocks(r.prompt, static_cast<int32_t>(kKvBlockSize), layout_fingerprint_);
    for (size_t i = 0; i < p.hashes.size(); ++i) {
      if (p.hashes[i] != chain[static_cast<size_t>(p.first_block) + i] || p.blocks[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("prefix_kv: block ", p.first_block + static_cast<int64_t>(i),
                                                       " is not this prompt's (hash differs) or has no data"));
      }
    }
    RETURN_IF_ERROR(ValidateImportedState(p, chain));
  }
  return absl::OkStatus();
}

std::unique_ptr<Sequence> Engine::MakeSequence(EngineRequest r, std::shared_ptr<OutputStream> out) {
  auto seq = std::make_unique<Sequence>();
  const int64_t context = backend_->config().max_position_embeddings;
  seq->id = std::move(r.id);
  seq->prompt_len = static_cast<int32_t>(r.prompt.size());
  seq->tokens = std::move(r.prompt);
  seq->sampling = r.sampling;
  if (r.sampling.seed) {
    seq->seed = *r.sampling.seed;
  } else {
    const uint64_t n = seed_counter_.fetch_add(1);
    seq->seed = XXH64(&n, sizeof n, 0x7a6e64656dull);
  }
  StopParams stop = std::move(r.stop);
  // Generation ends at the context's end at the latest.
  stop.max_tokens = static_cast<int32_t>(std::min<int64_t>(stop.max_tokens, context - seq->prompt_len));
  stop.min_tokens = std::min(stop.min_tokens, stop.max_tokens);
  seq->min_tokens = stop.min_tokens;
  seq->max_tokens = stop.max_tokens;
  seq->stop_token_ids = stop.stop_token_ids;
  seq->stop = std::make_unique<StopChecker>(*tokenizer_, std::move(stop), eos_ids_);
  // Replay what was generated before a migration: the stop checker's state (held-back
  // text, counts) continues exactly; nothing is emitted again.
  for (int32_t t : r.resume_tokens) {
    if (seq->stop->done()) break;
    (void)seq->stop->OnToken(t);
    seq->tokens.push_back(t);
  }
  seq->output = std::move(out);
  seq->kv_sink = r.kv_sink;
  seq->prefix_kv = std::move(r.prefix_kv);
  seq->metrics.prompt_tokens = seq->prompt_len;
  seq->submitted_at = Now();
  return seq;
}

absl::StatusOr<std::shared_ptr<OutputStream>> Engine::Submit(EngineRequest request) {
  RETURN_IF_ERROR(ValidateRequest(request));
  auto out = std::make_shared<OutputStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("engine is shutting down");
    if (live_ids_.contains(request.id)) {
      return absl::InvalidArgumentError(absl::StrCat("request id '", request.id, "' is already in use"));
    }
    if (queued_ >= options_.max_waiting) {
      return absl::ResourceExhaustedError(absl::StrCat("the engine's waiting queue is full (", options_.max_waiting,
                                                       " requests); retry later"));
    }
    ++queued_;
    live_ids_[request.id] = true;
  }
  const OutputConstraint constraint = std::move(request.constraint);
  auto seq = std::make_shared<std::unique_ptr<Sequence>>(MakeSequence(std::move(request), out));
  (*seq)->queued = true;
  (*seq)->speculative = Drafts((*seq)->kv_sink);
  if (!constraint.active()) {
    Post([this, seq] { scheduler_->Add(std::move(*seq)); });
    return out;
  }
  Post([this, seq, constraint] {
    const std::string id = (*seq)->id;
    CompileThen(id, constraint, [this, seq](Compiled g) {
      std::unique_ptr<Sequence> s = std::move(*seq);
      absl::Status st = g.ok() ? AttachMatcher(*s, *g) : g.status();
      if (!st.ok()) {
        RequestOutput o;
        o.status = std::move(st);
        Finish(std::move(s), std::move(o));
        return;
      }
      scheduler_->Add(std::move(s));
    });
  });
  return out;
}

void Engine::Cancel(const std::string& id) {
  Post([this, id] {
    if (auto it = compiling_.find(id); it != compiling_.end()) {
      std::function<void(Compiled)> then = std::move(it->second);
      compiling_.erase(it);
      then(absl::CancelledError(absl::StrCat("request '", id, "' was cancelled")));
      return;
    }
    for (auto it = kv_waiters_.begin(); it != kv_waiters_.end(); ++it) {
      if (it->id != id) continue;
      ReserveDone done = std::move(it->done);
      kv_waiters_.erase(it);
      done(absl::CancelledError(absl::StrCat("reservation '", id, "' was cancelled")));
      return;
    }
    // Freed, or quarantined while a writer may still write into it (kv_leases.h).
    leases_->Release(id, Now());
    std::unique_ptr<Sequence> seq = scheduler_->Remove(id);
    if (!seq) return;
    RequestOutput out;
    out.text = seq->stop->Flush();
    out.finished = true;
    out.status = absl::CancelledError(absl::StrCat("request '", id, "' was cancelled"));
    Finish(std::move(seq), std::move(out));
  });
}

void Engine::Post(Command c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  cv_.notify_all();
}

void Engine::Finish(std::unique_ptr<Sequence> seq, RequestOutput out) {
  if (in_flight_) in_flight_->dropped.insert(seq.get());
  if (emitting_ != nullptr) emitting_->dropped.insert(seq.get());
  const double now = Now();
  if (seq->queued) {
    std::lock_guard<std::mutex> lock(mu_);
    --queued_;
    seq->queued = false;
  }
  RequestMetrics& m = seq->metrics;
  m.completion_tokens = ChosenTokens(*seq);
  m.e2e_s = now - seq->submitted_at;
  if (seq->first_scheduled_at >= 0) m.queue_s = seq->first_scheduled_at - seq->submitted_at;
  if (seq->first_token_at >= 0) {
    m.ttft_s = seq->first_token_at - seq->submitted_at;
    m.prefill_s = seq->first_token_at - std::max(seq->first_scheduled_at, seq->submitted_at);
  }
  out.finished = true;
  out.metrics = m;
  counters_.requests_finished++;
  counters_.prompt_tokens_cached += m.cached_prompt_tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ids_.erase(seq->id);
  }
  if (options_.on_request_finished) options_.on_request_finished(m, out.status);
  // Whoever sees the final output also sees the engine's state after it (blocks freed).
  PublishStats();
  seq->output->Push(std::move(out));
}

void Engine::ExpireLeases() { leases_->Tick(Now()); }

void Engine::Loop() {
  for (;;) {
    std::deque<Command> commands;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool idle = scheduler_->empty() && !in_flight_;
      if (idle && commands_.empty() && !stop_) {
        if (leases_->empty() && kv_waiters_.empty()) {
          cv_.wait(lock, [this] { return stop_ || !commands_.empty(); });
        } else {
          // Wake for the next lease expiry or stuck quarantine, or end of a reservation's wait.
          double next = leases_->NextDeadline();
          for (const KvWaiter& w : kv_waiters_) next = std::min(next, w.deadline);
          const double wait_s = std::max(0.0, next - Now());
          cv_.wait_for(lock, std::chrono::duration<double>(std::min(wait_s, 1.0)),
                       [this] { return stop_ || !commands_.empty(); });
        }
      }
      if (stop_) break;
      commands.swap(commands_);
    }
    for (Command& c : commands) c();
    ExpireLeases();
    AdmitKvWaiters();
    if (in_flight_) {
      Advance();
    } else if (!scheduler_->empty()) {
      Step();
    }
    AdmitKvWaiters();  // blocks the step freed
    PublishStats();
  }
  // Shutdown: the step in flight finishes first (its sequences' placeholders stay), then
  // everything still live ends.
  if (in_flight_) {
    if (!in_flight_->result) (void)backend_->CollectSample();
    in_flight_.reset();
  }
  leases_->ReleaseAll();
  while (!compiling_.empty()) {
    std::function<void(Compiled)> then = std::move(compiling_.begin()->second);
    compiling_.erase(compiling_.begin());
    then(absl::UnavailableError("the engine shut down"));
  }
  for (KvWaiter& w : kv_waiters_) w.done(absl::UnavailableError("the engine shut down"));
  kv_waiters_.clear();
  for (std::unique_ptr<Sequence>& seq : scheduler_->TakeAll()) {
    RequestOutput out;
    out.status = absl::UnavailableError("the engine shut down");
    Finish(std::move(seq), std::move(out));
  }
  PublishStats();
}

void Engine::Step() {
  const double started = Now();
  const int64_t generated_before = counters_.generated_tokens;
  StepPlan plan = scheduler_->Schedule();
  EndRejected(plan);
  if (plan.empty()) return;
  StepBatch batch = AssembleBatch(plan);
  std::vector<SampleRow> sample_rows;
  const bool device_sampling = options_.speculative_tokens > 0 ? SpeculativeDeviceRows(plan, &sample_rows)
                                                               : DeviceSampleRows(plan, &sample_rows);
  // (Nothing is in flight here, so KV this assembly copied in is in place before the launch.)
  if (device_sampling && batch.device_error.ok() && Pipelinable(plan)) {
    Launch(std::move(plan), std::move(batch), std::move(sample_rows));
    return;
  }
  ForwardOptions fo = ForwardOptionsFor(plan, batch);
  absl::StatusOr<std::vector<float>> logits = std::vector<float>{};
  absl::StatusOr<std::vector<int32_t>> device_tokens = std::vector<int32_t>{};
  if (!batch.device_error.ok()) {
    logits = batch.device_error;
  } else if (device_sampling) {
    device_tokens = backend_->ForwardSample(batch.sequences, *pool_, sample_rows, WithMaskFill(std::move(fo)));
    if (!device_tokens.ok()) logits = device_tokens.status();
  } else {
    logits = backend_->Forward(batch.sequences, *pool_, fo);
  }
  if (logits.ok() && !batch.device_error.ok()) logits = batch.device_error;
  counters_.steps++;
  if (!logits.ok()) {
    FailStep(plan, logits.status(), nullptr);
    return;
  }
  if (absl::Status st = ExportedSequencesToHost(plan); !st.ok()) {
    FailStep(plan, st, nullptr);
    return;
  }
  std::vector<Sequence*> ended;
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.reaches_end()) ended.push_back(c.seq);
  }
  scheduler_->OnStepComputed(plan);
  CopyStateSnapshots();
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& s = *c.seq;
    if (s.kv_sink == nullptr) continue;
    s.exported_upto = c.start + c.num_tokens;
    // Other layouts hand over the whole sequence once: its rings and states are final now.
    if (!latent_layout_ && c.reaches_end()) {
      KvSequenceKv kv{.request_id = &s.id, .pool = pool_.get(), .block_table = s.blocks, .state_slot = s.state_slot,
                      .num_tokens = s.exported_upto};
      const size_t usable = static_cast<size_t>(s.prompt_len - 1) / static_cast<size_t>(kKvBlockSize);
      if (usable > 0 && usable <= s.block_hashes.size()) {
        kv.snapshot_slot = scheduler_->prefix_states().Find(s.block_hashes[usable - 1]);
        kv.snapshot_tokens = kv.snapshot_slot >= 0 ? static_cast<int64_t>(usable) * kKvBlockSize : 0;
      }
      s.kv_sink->OnSequenceKv(kv);
    }
  }
  if (options_.speculative_tokens > 0) {
    // What the step's decodes did, before the plan's sequences may end.
    int64_t decoding = 0;
    bool drafted = false, decode_only = true;
    for (const ScheduledChunk& c : plan.chunks) {
      decode_only &= c.reaches_end() && c.num_tokens - c.num_drafts == 1;
      drafted |= c.num_drafts > 0;
      ++decoding;
    }
    EmitSpeculative(plan, device_sampling ? nullptr : &*logits, device_sampling ? &*device_tokens : nullptr);
    // States where accepted drafts reached a snapshot boundary, now that the backend
    // moved them past the drafts (prefix_states.h).
    CopyStateSnapshots();
    if (decode_only) {
      draft_policy_.Record(decoding, drafted, counters_.generated_tokens - generated_before, Now() - started);
    }
    return;
  }
  EmitTokens(ended, device_sampling ? &*device_tokens : nullptr, device_sampling ? nullptr : &*logits,
             /*in_place=*/false, nullptr);
}

void Engine::Advance() {
  // The next step, scheduled while the one in flight computes: its sequences' pending
  // tokens are computed by it, their values filled in before it launches.
  StepPlan next = scheduler_->Schedule();
  EndRejected(next);

  InFlight done = std::move(*in_flight_);
  in_flight_.reset();
  absl::StatusOr<std::vector<int32_t>> tokens = done.result ? std::move(*done.result) : backend_->CollectSample();
  if (tokens.ok() && tokens->size() != done.rows.size()) {
    tokens = absl::InternalError(absl::StrCat(tokens->size(), " tokens for ", done.rows.size(), " sampled rows"));
  }
  if (!tokens.ok()) {
    // The next plan is dropped: Step schedules again (the sequences of this one are gone).
    FailStep(done.plan, tokens.status(), &done);
    return;
  }
  for (const ScheduledChunk& c : done.plan.chunks) {
    if (!done.dropped.contains(c.seq)) scheduler_->PublishComputed(*c.seq);
  }
  CopyStateSnapshots();
  for (size_t i = 0; i < done.rows.size(); ++i) {
    Sequence* s = done.rows[i];
    if (done.dropped.contains(s)) continue;
    TANDEM_CHECK(s->pending_token && s->tokens.back() == kPendingToken) << s->id;
    s->tokens.back() = (*tokens)[i];
    s->pending_token = false;
    // Before the next launch, whose mask for this sequence starts after this token.
    if (s->matcher) AcceptConstrained(*s, (*tokens)[i]);
  }
  emitting_ = &done;
  // Launch the next step before this one's outputs: the device waits only for this.
  if (!next.empty() && Pipelinable(next)) {
    std::vector<SampleRow> rows;
    if (DeviceSampleRows(next, &rows)) {
      StepBatch batch = AssembleBatch(next);
      Launch(std::move(next), std::move(batch), std::move(rows));
    }
  }
  // (A next plan not launched is dropped: the following Step schedules it again, one at a
  // time, after these outputs.)
  EmitTokens(done.rows, &*tokens, nullptr, /*in_place=*/true, &done);
  emitting_ = nullptr;
}

void Engine::CopyStateSnapshots() {
  for (const StateCopy& c : scheduler_->TakeStateSnapshots()) CopyStateSlot(c.from, c.to, /*to_host=*/true);
  const PrefixStates& states = scheduler_->prefix_states();
  if (states.version() == snapshot_version_) return;
  snapshot_version_ = states.version();
  std::vector<uint64_t> held = states.HeldHashes();
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_hashes_ = std::unordered_set<uint64_t>(held.begin(), held.end());
}

void Engine::EndRejected(StepPlan& plan) {
  counters_.preemptions += plan.num_preempted;
  for (std::unique_ptr<Sequence>& seq : plan.rejected) {
    RequestOutput out;
    out.text = seq->stop->Flush();
    out.status = absl::ResourceExhaustedError(absl::StrCat(
        "request '", seq->id, "' needs more KV cache blocks than the engine has (", scheduler_->blocks().num_blocks(),
        scheduler_->num_pools() > 1 ? " per data-parallel rank" : "", ")"));
    Finish(std::move(seq), std::move(out));
  }
  plan.rejected.clear();
}

Engine::StepBatch Engine::AssembleBatch(const StepPlan& plan) {
  const double now = Now();
  StepBatch b;
  b.sequences.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& s = *c.seq;
    if (s.first_scheduled_at < 0) s.first_scheduled_at = now;
    if (s.queued) {
      std::lock_guard<std::mutex> lock(mu_);
      --queued_;
      s.queued = false;
    }
    if (s.import_state) {
      const int64_t tokens = CopyImportedPrefixAndState(s, &b.device_error);
      counters_.prompt_tokens_imported += tokens;
    } else if (s.import_end > s.import_begin) {
      const int64_t first = static_cast<int64_t>(s.import_begin) * cache_->block_size();
      const int64_t tokens = CopyImportedPrefix(s, *cache_);
      counters_.prompt_tokens_imported += tokens;
      if (!backend_->kv_in_host_pool()) {
        b.device_error.Update(backend_->KvFromHost(s.blocks, first, first + tokens, *pool_));
        counters_.kv_host_staged_bytes += tokens * cache_->num_layers() * kv_entry_dim() * sizeof(float);
      }
    }
    if (s.restore_state_from >= 0) {
      // A prefix-cache hit: the rings and states where the cached prefix ends.
      CopyStateSlot(s.restore_state_from, s.state_slot, /*to_host=*/false);
      scheduler_->prefix_states().Unpin(s.restore_state_from);
      s.restore_state_from = -1;
    }
    if (s.host_kv_upload_end > 0 && device_streams_) {
      b.device_error.Update(SequenceFromHost(s, s.host_kv_upload_end));
      s.host_kv_upload_end = 0;
    } else if (s.host_kv_upload_end > 0) {
      b.device_error.Update(backend_->KvFromHost(s.blocks, 0, s.host_kv_upload_end, *pool_));
      counters_.kv_host_staged_bytes += int64_t{s.host_kv_upload_end} * cache_->num_layers() * kv_entry_dim() *
                                        static_cast<int64_t>(sizeof(float));
      s.host_kv_upload_end = 0;
    }
    b.has_sink |= s.kv_sink != nullptr;
    b.sink_wants_host |= s.kv_sink != nullptr && s.kv_sink->wants_host_kv();
    ForwardSequence f{.tokens = std::span<const int32_t>(s.tokens.data() + c.start, c.num_tokens),
                      .start_position = c.start,
                      .block_table = s.blocks,
                      .no_logits = !c.reaches_end(),
                      .state_slot = s.state_slot,
                      .first_kv_cached = c.first_kv_cached,
                      .dp_rank = s.dp_rank};
    if (options_.speculative_tokens > 0) {
      // The MTP layer's slots: with the chunk's own tokens for a prompt chunk; by the draft
      // pass after sampling for a chunk reaching the end (its hidden states kept for it);
      // never from drafts not yet verified.
      f.mtp = c.num_drafts == 0;
      const int32_t end = c.start + c.num_tokens;
      if (f.mtp && end < static_cast<int32_t>(s.tokens.size())) f.mtp_next_token = s.tokens[end];
      f.keep_hidden = c.reaches_end();
      f.num_drafts = c.num_drafts;
      if (c.num_drafts > 0) {
        s.verify_tokens.assign(1, s.tokens.back());
        s.verify_tokens.insert(s.verify_tokens.end(), s.drafts.begin(), s.drafts.end());
        TANDEM_CHECK_EQ(s.verify_tokens.size(), static_cast<size_t>(c.num_tokens)) << s.id;
        f.tokens = s.verify_tokens;
        f.all_logits = true;
      }
    }
    b.sequences.push_back(f);
    const int32_t computed_from = c.start + (c.first_kv_cached ? 1 : 0);
    const int32_t prompt_part = std::max(0, std::min(c.start + c.num_tokens, s.prompt_len) - computed_from);
    s.metrics.computed_prompt_tokens += prompt_part;
    counters_.prompt_tokens_computed += prompt_part;
  }
  return b;
}

ForwardOptions Engine::ForwardOptionsFor(const StepPlan& plan, StepBatch& batch) {
  ForwardOptions fo;
  if (!batch.has_sink || !latent_layout_) return fo;  // (other layouts: OnSequenceKv after the step)
  absl::Status* device_error = &batch.device_error;
  fo.after_layer_kv = [this, &plan, device_error](int64_t layer) {
    for (const ScheduledChunk& c : plan.chunks) {
      Sequence& s = *c.seq;
      if (s.kv_sink == nullptr) continue;
      if (PeerKvWriter* w = s.kv_sink->peer_writer()) {
        device_error->Update(w->WriteLayer(layer, s.blocks, s.exported_upto, c.start + c.num_tokens));
      }
      if (!s.kv_sink->wants_host_kv()) continue;
      if (!backend_->kv_in_host_pool()) {
        absl::Status st = backend_->KvToHost(layer, s.blocks, s.exported_upto, c.start + c.num_tokens, *pool_);
        counters_.kv_host_staged_bytes +=
            (c.start + c.num_tokens - s.exported_upto) * kv_entry_dim() * static_cast<int64_t>(sizeof(float));
        device_error->Update(st);
        if (!st.ok()) continue;  // nothing to send; the step fails below
      }
      s.kv_sink->OnLayerKv({.request_id = &s.id, .layer = layer, .begin = s.exported_upto,
                            .end = c.start + c.num_tokens, .entry_dim = kv_entry_dim(), .cache = cache_.get(),
                            .block_table = s.blocks});
    }
  };
  fo.after_layer_kv_enqueues_only = !batch.sink_wants_host;
  return fo;
}

bool Engine::DeviceSampleRows(const StepPlan& plan, std::vector<SampleRow>* rows) {
  rows->clear();
  pending_masks_.clear();
  if (!options_.sample_on_device || !backend_->samples_on_device()) return false;
  // Speculative steps verify drafts on the host (engine_speculative.cc).
  if (options_.speculative_tokens > 0) return false;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.reaches_end()) continue;
    const Sequence& s = *c.seq;
    // The device sampler has no logprobs, min_tokens or logit_bias: the host samples.
    if (s.sampling.logprobs > 0 || s.num_generated() < s.min_tokens || !s.sampling.logit_bias.empty()) {
      pending_masks_.clear();
      return false;
    }
    rows->push_back({.temperature = s.sampling.temperature,
                     .top_p = s.sampling.top_p,
                     .top_k = s.sampling.top_k,
                     .min_p = s.sampling.min_p,
                     .repetition_penalty = s.sampling.repetition_penalty,
                     .presence_penalty = s.sampling.presence_penalty,
                     .frequency_penalty = s.sampling.frequency_penalty,
                     .seed = s.seed,
                     .step = s.num_generated(),
                     .prompt_tokens = s.prompt(),
                     .output_tokens = s.generated()});
    if (s.matcher && !s.matcher->IsTerminated()) rows->back().allowed = DeviceMask(s, rows->size() - 1);
  }
  return !rows->empty();
}


bool Engine::Pipelinable(const StepPlan& plan) const {
  if (!options_.pipeline_steps || !options_.sample_on_device || !backend_->samples_on_device()) return false;
  // A drafting step's next step depends on which drafts it accepts.
  if (options_.speculative_tokens > 0) return false;
  for (const ScheduledChunk& c : plan.chunks) {
    const Sequence& s = *c.seq;
    if (s.kv_sink != nullptr || s.import_end > s.import_begin || s.host_kv_upload_end > 0) return false;
  }
  return true;
}

void Engine::Launch(StepPlan plan, StepBatch batch, std::vector<SampleRow> rows) {
  const absl::Status st = backend_->LaunchSample(batch.sequences, *pool_, rows, WithMaskFill(ForwardOptions{}));
  counters_.steps++;
  if (!st.ok()) {
    FailStep(plan, st, nullptr);
    return;
  }
  InFlight f;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.reaches_end()) continue;
    f.rows.push_back(c.seq);
  }
  scheduler_->OnStepLaunched(plan);
  for (Sequence* s : f.rows) {
    s->tokens.push_back(kPendingToken);
    s->pending_token = true;
  }
  f.plan = std::move(plan);
  in_flight_ = std::move(f);
}

void Engine::FailStep(const StepPlan& plan, const absl::Status& status, const InFlight* in_flight) {
  // Inputs were validated at submission: a failure here is the engine's bug, but it must
  // end the requests it hit rather than the process.
  for (const ScheduledChunk& c : plan.chunks) {
    if (in_flight != nullptr && in_flight->dropped.contains(c.seq)) continue;
    std::unique_ptr<Sequence> seq = scheduler_->Remove(c.seq->id);
    if (!seq) continue;
    RequestOutput out;
    out.status = absl::InternalError(absl::StrCat("forward pass failed: ", status.message()));
    Finish(std::move(seq), std::move(out));
  }
}

void Engine::EmitTokens(std::span<Sequence* const> ended, const std::vector<int32_t>* device_tokens,
                        std::vector<float>* logits, bool in_place, const InFlight* in_flight) {
  const int64_t vocab = backend_->config().vocab_size;
  const double after = Now();
  for (size_t row = 0; row < ended.size(); ++row) {
    if (in_flight != nullptr && in_flight->dropped.contains(ended[row])) continue;
    Sequence& s = *ended[row];
    // The output position of this row's token. In place, the token is already in
    // s.tokens, and the next step (launched before these outputs) may have appended its
    // placeholder after it.
    const int32_t step = ChosenTokens(s) - (in_place ? 1 : 0);
    SampledToken t;
    if (device_tokens != nullptr) {
      t.token = (*device_tokens)[row];
      counters_.device_sampled_tokens++;
    } else {
      std::span<float> lg(logits->data() + row * vocab, static_cast<size_t>(vocab));
      if (s.matcher) {
        ConstrainLogits(s, lg, step);
      } else if (step < s.min_tokens) {
        SuppressTokens(lg, eos_ids_);
        SuppressTokens(lg, s.stop_token_ids);
      }
      t = sampler_.Sample(lg, s.sampling, s.seed, step, s.prompt(), s.generated());
    }
    // (In place, Advance accepted it before launching the next step.)
    if (s.matcher && !in_place) AcceptConstrained(s, t.token);
    const StopResult r = s.stop->OnToken(t.token);
    if (!in_place) s.tokens.push_back(t.token);
    scheduler_->OnTokenAppended(s);
    counters_.generated_tokens++;
    if (s.first_token_at < 0) s.first_token_at = after;

    RequestOutput out;
    if (AppendToOutput(s, t, r, out)) {
      Finish(scheduler_->Remove(s.id), std::move(out));
      continue;
    }
    if (step == 0) out.metrics.ttft_s = s.first_token_at - s.submitted_at;
    s.output->Push(std::move(out));
  }
}

bool Engine::AppendToOutput(Sequence& s, const SampledToken& t, const StopResult& r, RequestOutput& out) {
  out.token_ids.push_back(t.token);
  out.text += r.text_delta;
  if (s.sampling.logprobs > 0) out.logprobs.push_back({t.token, t.logprob, t.top_logprobs});
  const bool context_full =
      static_cast<int64_t>(s.prompt_len) + ChosenTokens(s) >= backend_->config().max_position_embeddings;
  // An accepted end token ends the constraint: with ignore_eos the stop checker goes on,
  // but nothing more is allowed.
  const bool constraint_ended = s.matcher && s.matcher->IsTerminated();
  if (!(r.finished || s.kv_sink != nullptr || context_full || constraint_ended)) return false;
  out.finish_reason = r.finished         ? r.reason
                      : constraint_ended ? FinishReason::kStop
                      : context_full     ? FinishReason::kLength
                                         : FinishReason::kNone;
  out.matched_stop = r.matched_stop;
  if (!r.finished && (context_full || constraint_ended)) out.text += s.stop->Flush();
  return true;
}

void Engine::SettleInFlight() {
  if (in_flight_ && !in_flight_->result) in_flight_->result = backend_->CollectSample();
}

}  // namespace tandem

