// The engine: one thread owns the model, the KV cache and the scheduler; callers talk to
// it through a bounded submission queue and get each request's outputs through an
// OutputStream. This is the API the services build on:
//   - Submit: generate (prefill, then decode until a stop), or prefill only (the prompt's
//     KV streamed to a KvSink layer by layer as computed; ends with the first token);
//   - ReserveKv + WriteKv + SubmitImported: continue a request whose prompt KV another
//     engine computed (the decode side of disaggregation); an unused reservation expires,
//     into quarantine while a writer recorded on it (BeginKvWrites) may still write;
//   - Cancel, Stats.
// Thread-safe: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/kv_pool.h"
#include "engine/model/model_backend.h"
#include "engine/runtime/block_hash.h"
#include "engine/runtime/constraint_compiler.h"
#include "engine/runtime/draft_policy.h"
#include "engine/runtime/kv_leases.h"
#include "engine/runtime/kv_sink.h"
#include "engine/runtime/output_constraint.h"
#include "engine/runtime/output_stream.h"
#include "engine/runtime/prefix_kv.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"
#include "engine/runtime/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem {

// Tokens per engine step when EngineOptions::max_batch_tokens is 0: 8192 on a GPU ("cuda",
// "cuda:N"), 2048 on the CPU. On a GPU a 2048-token prefill chunk leaves the per-expert
// GEMMs small and launch-bound (an 8K-token prompt: 197-247 ms in 2048-token chunks against
// 116 ms in one pass on the H200, docs/performance.md); on the CPU a long chunk would hold
// the decodes sharing its step for seconds.
int32_t DefaultMaxBatchTokens(const std::string& device);

// The most drafts a sequence verifies in one step (--speculative-tokens).
inline constexpr int32_t kMaxSpeculativeTokens = 16;

struct EngineOptions {
  std::string device = "cpu";              // cpu, cuda, cuda:N (model_backend.h)
  int num_threads = 0;                     // CPU threads for the model (0: all)
  double gpu_memory_utilization = 0.9;     // cuda: fraction of the GPU for weights + KV cache
  int64_t kv_cache_bytes = 512ll << 20;    // sizes the KV cache when num_kv_blocks is 0
  // Caller-owned memory for the KV cache (e.g. allocated by a transfer layer so peers can
  // write into it); it must outlive the engine. Null: the engine allocates its own.
  float* kv_memory = nullptr;
  size_t kv_memory_bytes = 0;
  int32_t num_kv_blocks = 0;
  int32_t max_batch_tokens = 0;            // tokens per step; 0: DefaultMaxBatchTokens(device)
  int32_t max_running = 64;                // sequences decoding together
  int32_t max_waiting = 1024;              // admitted but not yet running; beyond: RESOURCE_EXHAUSTED
  bool enable_prefix_cache = true;
  // A model whose KV has per-sequence streams (DeepSeek-V4's sliding window and compressor
  // states) reuses a cached prefix only from a snapshot of those streams where it ends
  // (prefix_states.h): this many are kept (-1: max_running), each of the layout's
  // per-sequence bytes, out of the KV cache memory. 0 turns such a model's prefix cache off.
  int32_t prefix_state_snapshots = -1;
  // Such a model also snapshots a decoding sequence where its tokens fill a block (one per
  // sequence, the last kept), so a conversation's next turn reuses the answer too. A
  // decode-only replica, whose prompts all arrive computed, turns it off.
  bool decode_state_snapshots = true;
  double kv_lease_seconds = 30.0;          // an unused ReserveKv expires after this
  // A reservation that ends unused while a writer recorded on it may still write is
  // quarantined until that writer is known to have stopped, however long that takes
  // (kv_leases.h); one quarantined longer than this counts as stuck (a warning, nothing more).
  double kv_quarantine_stuck_seconds = 60.0;
  // ReserveKvAsync calls waiting for KV room (first come, first served); beyond:
  // RESOURCE_EXHAUSTED at once.
  int32_t max_kv_waiters = 1024;
  // Device backends: choose tokens on the device (ModelBackend::ForwardSample, the CPU
  // Sampler's choice) for steps where no request wants logprobs or suppressed tokens;
  // false: logits always cross to the host and the CPU samples.
  bool sample_on_device = true;
  // Steps whose tokens are chosen on the device run pipelined: while one computes, the
  // engine schedules and assembles the next (its sequences' new tokens as placeholders)
  // and, once the step's tokens are in, launches the next before emitting this one's
  // outputs — so the device waits only for the launch, not for scheduling, stop checks
  // and outputs. A sequence that ends on a token is then computed one step further (that
  // result is dropped). Steps with logprobs, suppressed tokens, KV export or imported KV
  // run one at a time. false: every step one at a time.
  bool pipeline_steps = true;
  // --batch-invariant: the backend computes each sequence's logits independently of its
  // batch companions and of prefill chunking (BackendOptions::batch_invariant), so seeded
  // sampling gives the same tokens whatever the load (docs/batch-invariance.md).
  bool batch_invariant = false;
  // --fp8-decode: an FP8 checkpoint's decode steps on the GPU multiply its stored FP8
  // weights (BackendOptions::fp8_decode).
  bool fp8_decode = false;
  // --fp8-prefill: an FP8 checkpoint's prefill passes on the GPU multiply on the FP8 tensor
  // cores (BackendOptions::fp8_prefill).
  bool fp8_prefill = false;
  // Structured output: a request's constraint is compiled off the engine thread
  // (constraint_compiler.h) within this many seconds (--grammar-compile-timeout-ms), or
  // the request fails with INVALID_ARGUMENT.
  double grammar_compile_timeout_s = 5.0;
  // Device-sampling steps fill their constrained rows' token masks on this many threads
  // (the engine thread and grammar_mask_threads - 1 others), while the device runs the
  // step's forward pass (--grammar-mask-threads). 0: a quarter of the hardware threads,
  // 1 to 8.
  int32_t grammar_mask_threads = 0;
  // Speculative decoding with the checkpoint's MTP layer (docs/speculative-decoding.md):
  // up to this many drafts per sequence and step (0: off), verified by the next step; a
  // sequence stops drafting at a draft whose probability under the MTP layer is below
  // speculative_min_confidence. The KV layout then holds the MTP layer's KV (a different
  // fingerprint: every replica of a cluster must agree). Drafting steps run one at a time.
  int32_t speculative_tokens = 0;
  float speculative_min_confidence = 0.0f;
  // Draft only where it measured faster (draft_policy.h: tokens per second of steps with
  // and without drafts, per batch size); false: every step drafts. Either way a request's
  // tokens are the same.
  bool speculative_adaptive = true;
  // Seconds on a monotonic clock; injectable for tests.
  std::function<double()> clock;
  // Tests and benchmarks: the model backend for the checkpoint directory instead of
  // LoadBackend's for `device` (e.g. a fake whose forward pass costs nothing).
  std::function<absl::StatusOr<std::unique_ptr<ModelBackend>>(const std::string& dir)> backend_factory;
  // Called on the engine thread when a request ends (metrics); must not block.
  std::function<void(const RequestMetrics&, const absl::Status&)> on_request_finished;
};

struct EngineRequest {
  std::string id;  // unique among the engine's live requests
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopParams stop;
  // Prefill only: the prompt's KV goes to kv_sink as each layer computes it (the sink
  // must outlive the request); the request ends after its first token.
  KvSink* kv_sink = nullptr;
  // Optional: KV of leading full blocks of the prompt computed elsewhere (the kvstore),
  // copied in instead of computed (prefix_kv.h). Submit checks its hashes against the
  // prompt (INVALID_ARGUMENT when they differ or it reaches the prompt's last token).
  std::shared_ptr<const PrefixKv> prefix_kv;
  // Tokens this request already generated elsewhere (a migration after a replica died):
  // they join the sequence as its output so far, their text is not emitted again, and
  // sampling continues at output position resume_tokens.size(), so the continuation is the
  // one the lost replica would have produced.
  std::vector<int32_t> resume_tokens;
  // Structured output: every generated token keeps the output a prefix of a sentence of
  // the constraint, and EOS comes only where it may end (output_constraint.h). Compiled
  // before the request is admitted; a constraint that does not compile ends the request
  // with INVALID_ARGUMENT (through the stream for Submit, through `done` for
  // SubmitImportedAsync). resume_tokens (and SubmitImported's first token) must satisfy
  // it: the matcher is rebuilt from them.
  OutputConstraint constraint;
  // SubmitImported: the writer (its incarnation, kv_leases.h) whose prefill into the
  // reservation answered, so whose writes are complete; 0: none known.
  uint64_t kv_writer = 0;
  // SubmitImported into an engine that drafts: the hidden state of the prompt's last
  // position, from the prefill replica (RequestOutput::last_hidden); required there.
  std::vector<float> mtp_hidden;
};

struct EngineStats {
  // Data-parallel attention (docs/parallel.md): each rank's share, in rank order; empty
  // without. A request must fit one rank's pool, so the replica's free blocks together
  // overstate the room for one.
  struct RankLoad {
    int64_t kv_blocks_total = 0;
    int64_t kv_blocks_in_use = 0;
    int64_t running = 0;
    int64_t placed = 0;  // sequences placed there so far (Scheduler::placed)
  };
  std::vector<RankLoad> dp_ranks;
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_in_use = 0;
  double kv_usage = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t prompt_tokens_cached = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t requests_finished = 0;
  int64_t kv_leases_expired = 0;
  int64_t kv_writers_refused = 0;  // BeginKvWrites on a reservation that was not live
  // Reservations held back from reuse while a writer may still write (kv_leases.h): blocks
  // and leases now, those quarantined past kv_quarantine_stuck_seconds, and how quarantines
  // ended (KvLeaseStats::ends_*).
  int64_t kv_blocks_quarantined = 0;
  int64_t kv_leases_quarantined = 0;
  int64_t kv_quarantine_stuck = 0;
  int64_t kv_quarantine_ends_writer_ended = 0;
  int64_t kv_quarantine_ends_writer_gone = 0;
  int64_t kv_quarantine_ends_decoded = 0;
  int64_t kv_quarantine_ends_no_writer = 0;
  int64_t kv_reserve_requests = 0;  // ReserveKv / ReserveKvAsync calls (decode replicas: Reserve RPCs)
  int64_t kv_reserve_waiting = 0;   // ReserveKvAsync calls waiting for room now
  // Prefix cache (block manager): lookups, blocks looked up and found, evictions.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_queried_blocks = 0;
  int64_t prefix_cache_hit_blocks = 0;
  int64_t prefix_cache_evictions = 0;
  // Per-sequence stream snapshots (prefix_states.h): held now, and forgotten for room.
  int64_t prefix_state_snapshots = 0;
  int64_t prefix_state_evictions = 0;
  int64_t prompt_tokens_imported = 0;  // prompt tokens copied in from EngineRequest::prefix_kv
  // Device backends: KV bytes copied between the device pool and the host pool (export of
  // prefill-only requests' KV for the transfer layer, imported KV); the device-to-device
  // path copies none.
  int64_t kv_host_staged_bytes = 0;
  int64_t device_sampled_tokens = 0;  // tokens chosen on the device (no logits to the host)
  // Structured output: constraints compiled (cache hits included) and refused, compiles
  // answered from the cache, seconds spent compiling, tokens chosen under a constraint.
  int64_t constraints_compiled = 0;
  int64_t constraints_failed = 0;
  int64_t constraint_cache_hits = 0;
  double constraint_compile_seconds = 0;
  int64_t constrained_tokens = 0;
  // Engine-thread seconds filling token masks (overlapped with the device's forward pass
  // for device sampling) and feeding chosen tokens to the matchers.
  double constraint_mask_seconds = 0;
  double constraint_accept_seconds = 0;
  // Speculative decoding: drafts verified, accepted drafts by position in the step (index
  // 0: the first draft), and verify steps by how many drafts they accepted (index a: a
  // accepted), each sized speculative_tokens (+ 1).
  int64_t spec_draft_tokens = 0;
  std::vector<int64_t> spec_accepted_by_position;
  std::vector<int64_t> spec_accepted_length;
};

class Engine {
 public:
  // Loads the model and tokenizer from a checkpoint directory and starts the engine thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const std::string& model_dir, EngineOptions options);
  // Stops the thread; live requests end with UNAVAILABLE.
  ~Engine();

  // Errors (nothing is queued then): INVALID_ARGUMENT (empty prompt, a token outside the
  // vocabulary, a prompt that leaves no room in the context, bad sampling/stop parameters
  // (named), an id in use), RESOURCE_EXHAUSTED (the waiting queue is full: retry later; or
  // a prompt larger than the whole KV cache).
  absl::StatusOr<std::shared_ptr<OutputStream>> Submit(EngineRequest request);
  // Ends a live request with CANCELLED and frees its blocks; unknown ids are ignored. For a
  // ReserveKv id it ends the reservation as ReleaseKv does; a waiting one is withdrawn.
  void Cancel(const std::string& id);

  // Decode side of disaggregation. Reserves KV blocks for `num_tokens` positions under
  // `id` (freed if no SubmitImported follows within kv_lease_seconds) and returns the
  // block table to write into. Errors: RESOURCE_EXHAUSTED (not enough free blocks now),
  // INVALID_ARGUMENT (an id in use).
  absl::StatusOr<std::vector<int32_t>> ReserveKv(const std::string& id, int32_t num_tokens);
  // The reservation `id` will not be used: its blocks are freed when no writer recorded on
  // it may still write, else quarantined until each is known to have stopped (kv_leases.h).
  // `ended_writer` (an incarnation; 0: none) is known to be done (its prefill answered).
  // Unlike Cancel, a running request of that id is left alone. Unknown ids are ignored.
  void ReleaseKv(const std::string& id, uint64_t ended_writer = 0);
  // The writers of reservations (kv_leases.h). BeginKvWrites records `writer` on the live
  // reservation `id` of `token` and answers OK (it may write now) or FAILED_PRECONDITION
  // (it must not write); `done` runs once, inline on the caller's thread (the answer does
  // not wait for the engine's step in flight).
  void BeginKvWrites(const std::string& id, uint64_t token, KvWriter writer, std::function<void(absl::Status)> done);
  // One write session of writer `incarnation` ended (its EndWrites).
  void EndKvWrites(const std::string& id, uint64_t token, uint64_t incarnation);
  // Every write session of writer `incarnation` on `id` ended, known by `proof` (a prober's
  // finding: kEnded, its process holds none; kGone, its process is gone).
  void KvWriterStopped(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof);
  // Told on the engine thread when reservations go into and out of quarantine (null: none).
  // Must outlive the engine, or be replaced first: once this returns the previous one is
  // called no more.
  void SetKvQuarantineListener(KvQuarantineListener* listener);
  // ReserveKv without blocking the caller: `done` runs exactly once, on the engine thread
  // (keep it short: no waiting, no heavy work), or inline for a call refused before it is
  // queued. With `wait_s` > 0 a reservation that does not fit now waits (at most
  // max_kv_waiters) and is made as blocks free, the waiting ones in arrival order, each as
  // soon as it fits (a large one does not hold back smaller ones behind it); it ends
  // RESOURCE_EXHAUSTED when `wait_s` passes or the wait queue is full, OUT_OF_RANGE at once
  // when it is larger than the whole pool (it can never fit), CANCELLED on Cancel(id).
  // The reservation: its blocks and its token (for writers, BeginKvWrites).
  using ReserveDone = std::function<void(absl::StatusOr<KvLeases::Reservation>)>;
  void ReserveKvAsync(const std::string& id, int32_t num_tokens, double wait_s, ReserveDone done);
  // Copies entries of positions [first_position, first_position + n) of one layer into a
  // reservation's blocks (n = entries.size() / entry_dim). Safe from any thread: it only
  // touches the reserved blocks.
  absl::Status WriteKv(std::span<const int32_t> block_table, int64_t layer, int64_t first_position,
                       std::span<const float> entries);
  // Continues `request` (its prompt's KV written into the reservation `request.id`) from
  // `first_token`, which the prefill side sampled. With emit_first_token the output
  // stream starts with that token; without, it starts with the next one (the prefill
  // side already reported the first, with the same text delta: the stop checker sees the
  // token either way). Errors: FAILED_PRECONDITION (no live reservation: expired or never
  // made, or a writer other than request.kv_writer may still be writing into it: the
  // reservation is then quarantined), and Submit's. `where`: the KV was written into the host pool (kv_memory(),
  // uploaded to a device backend's pool before the first step) or straight into the
  // device backend's pool (ModelBackend::ShareKvPool).
  enum class ImportedKv { kHostPool, kDevicePool };
  absl::StatusOr<std::shared_ptr<OutputStream>> SubmitImported(EngineRequest request, int32_t first_token,
                                                               bool emit_first_token = true,
                                                               ImportedKv where = ImportedKv::kHostPool);
  // SubmitImported without blocking the caller: `done` runs exactly once, on the engine
  // thread (keep it short), or inline for a request refused before it is queued.
  using SubmitDone = std::function<void(absl::StatusOr<std::shared_ptr<OutputStream>>)>;
  void SubmitImportedAsync(EngineRequest request, int32_t first_token, bool emit_first_token, ImportedKv where,
                           SubmitDone done);
  // Compiles `c` into the constraint cache without a request (a decode replica, while the
  // prefill of the request it reserved for runs); errors are dropped (the request's own
  // submission reports them). Never blocks.
  void PrecompileConstraint(OutputConstraint c);
  // The model backend, for the device-to-device KV transfer calls that are thread-safe
  // (ShareKvPool, OpenPeerKv, DeviceKvChecksum).
  ModelBackend& backend() const { return *backend_; }

  // The KV cache memory, for a transfer layer to register: `num_layers` x `num_blocks` x
  // `block_size` entries of `entry_dim` floats, layer-major. Writers must only touch
  // blocks reserved with ReserveKv.
  struct KvMemory {
    float* base = nullptr;
    size_t bytes = 0;
    int64_t num_layers = 0;
    int64_t num_blocks = 0;
    int64_t block_size = 0;
    int64_t entry_dim = 0;  // 0: the layout is not one latent stream (kv_layout() has its streams)
    int64_t num_state_slots = 0;
  };
  KvMemory kv_memory() const;

  EngineStats Stats() const;

  // Prefix-cache changes for cache-aware routing: the block hashes that became cached
  // (stored) or were evicted (removed) since the previous call. `full` means `stored` is
  // the complete set of cached hashes (first call, `want_full`, or the change log
  // overflowed) and the consumer must replace its view. Thread-safe.
  struct KvEvents {
    std::vector<uint64_t> stored;
    std::vector<uint64_t> removed;
    bool full = false;
  };
  KvEvents TakeKvEvents(bool want_full = false);
  // How many leading `hashes` (a prompt's block hash chain) the prefix cache holds, as of
  // the engine's last step: a hint for what to fetch from elsewhere (the blocks may be
  // evicted before a request uses them). Thread-safe.
  int32_t CachedPrefixLength(std::span<const uint64_t> hashes) const;
  // For a layout with per-sequence streams: how many leading `hashes` a prefix-cache hit
  // could use here now (cached blocks up to the last one with a state snapshot,
  // prefix_states.h); CachedPrefixLength for one latent stream. A hint, thread-safe.
  int32_t CachedStatePrefixLength(std::span<const uint64_t> hashes) const;
  const ModelInfo& config() const { return backend_->config(); }
  std::string device_name() const { return backend_->device_name(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Values per token per layer of the one latent stream that KV export and import move
  // layer by layer; 0 for a model whose KV has other streams (they move a whole sequence at
  // once: KvSink::OnSequenceKv, KvPool::SequenceExtents).
  int64_t kv_entry_dim() const { return latent_layout_ ? layout_.streams[0].width : 0; }
  uint64_t layout_fingerprint() const { return layout_fingerprint_; }
  // The KV layout the fingerprint is of: the streams the architecture declares.
  const KvLayout& kv_layout() const { return layout_; }

 private:
  Engine() = default;
  using Command = std::function<void()>;

  absl::Status ValidateRequest(const EngineRequest& r) const;
  std::unique_ptr<Sequence> MakeSequence(EngineRequest r, std::shared_ptr<OutputStream> out);
  void Post(Command c);
  void Loop();
  // The batch of a scheduled step, its KV imports done.
  struct StepBatch {
    std::vector<ForwardSequence> sequences;
    bool has_sink = false;
    bool sink_wants_host = false;
    absl::Status device_error;  // a failed copy between the host and device KV pools
  };
  // A step launched on the backend (ModelBackend::LaunchSample) and not yet emitted.
  struct InFlight {
    StepPlan plan;
    std::vector<Sequence*> rows;  // the sequence of each sampled row, in row order
    // Sequences that ended while the step computed (Finish): their rows are skipped and
    // the pointers never dereferenced again.
    std::unordered_set<const Sequence*> dropped;
    // Collected ahead of its turn (SettleInFlight).
    std::optional<absl::StatusOr<std::vector<int32_t>>> result;
  };
  // One loop iteration's work: Step with no step in flight, else Advance.
  void Step();
  void Advance();
  // Counts a fresh plan's preemptions and ends its rejected sequences (RESOURCE_EXHAUSTED).
  void EndRejected(StepPlan& plan);
  // The state snapshots the scheduler asked for after a step (prefix_states.h).
  void CopyStateSnapshots();
  // A prefix import with its state (PrefixKv::state) into the pool; its tokens.
  int64_t CopyImportedPrefixAndState(Sequence& s, absl::Status* device_error);
  absl::Status ValidateImportedState(const PrefixKv& p, std::span<const uint64_t> chain) const;
  StepBatch AssembleBatch(const StepPlan& plan);
  ForwardOptions ForwardOptionsFor(const StepPlan& plan, StepBatch& batch);
  // The device sampling rows of the plan's sampled chunks; false when some row needs the
  // host (logprobs, tokens still to suppress) or the backend cannot.
  bool DeviceSampleRows(const StepPlan& plan, std::vector<SampleRow>* rows);
  // Whether `plan` may be launched pipelined (options, device sampling, no KV export or
  // import).
  bool Pipelinable(const StepPlan& plan) const;
  // Launches `plan` (device sampling) and leaves it in flight: the sampled sequences get a
  // pending token, the chunks count as computed.
  void Launch(StepPlan plan, StepBatch batch, std::vector<SampleRow> rows);
  // Ends every request of a failed step.
  void FailStep(const StepPlan& plan, const absl::Status& status, const InFlight* in_flight);
  // A device pool mirrored in the host pool's layout (device_streams_, engine_device_streams.cc):
  // the sequences of `plan` that end their export in this step, copied to the host pool
  // for their sinks; a sequence's KV that arrived in the host pool, copied to the device;
  // an imported prefix's blocks and state likewise; a state slot copied in both pools
  // (to_host: the host pool's copy made current too, for a snapshot that an export reads).
  absl::Status ExportedSequencesToHost(const StepPlan& plan);
  absl::Status SequenceFromHost(const Sequence& s, int64_t num_tokens);
  absl::Status ImportedPrefixToDevice(const Sequence& s);
  void CopyStateSlot(int64_t from, int64_t to, bool to_host);
  // Stop checks, outputs and finishes for the sampled sequences `ended` (row order), with
  // their tokens: device_tokens (already in place in the sequences when in_place), or
  // chosen here from `logits`.
  void EmitTokens(std::span<Sequence* const> ended, const std::vector<int32_t>* device_tokens,
                  std::vector<float>* logits, bool in_place, const InFlight* in_flight);
  // Waits for the step in flight (if any) without emitting it: before KV blocks may go to
  // a writer outside the device stream's order (ReserveKv).
  void SettleInFlight();
  // Sends `out` as the request's final output (filling metrics) and forgets the request.
  // The sequence must already be out of the scheduler (its blocks released).
  void Finish(std::unique_ptr<Sequence> seq, RequestOutput out);
  void ExpireLeases();
  // ReserveKv's allocation (engine thread): the blocks, or RESOURCE_EXHAUSTED for now.
  absl::StatusOr<KvLeases::Reservation> ReserveNow(const std::string& id, int32_t num_tokens);
  // The most blocks a reservation could take now (one rank's pool holds a reservation).
  int32_t MostFreeOnARank() const;
  // Makes the waiting reservations that now fit (in order), ends those whose wait ran out.
  void AdmitKvWaiters();
  void PublishStats();
  // Structured output (engine thread). A constrained request waits in compiling_ (by id)
  // until its constraint is compiled; `then` gets the grammar, or why there is none
  // (refused, CANCELLED by Cancel, UNAVAILABLE at shutdown).
  using Compiled = absl::StatusOr<ConstraintCompiler::Grammar>;
  void CompileThen(const std::string& id, const OutputConstraint& c, std::function<void(Compiled)> then);
  // Gives `s` a matcher of `g` that has accepted its output so far.
  absl::Status AttachMatcher(Sequence& s, const ConstraintCompiler::Grammar& g) const;
  // SubmitImportedAsync's admission on the engine thread, once any constraint compiled.
  void AdmitImported(std::unique_ptr<Sequence> seq, int32_t first_token, bool emit_first_token, ImportedKv where,
                     uint64_t kv_writer, SubmitDone done);
  // Masks a constrained row's logits before sampling (and keeps min_tokens' suppression
  // from leaving no token at all).
  void ConstrainLogits(Sequence& s, std::span<float> logits, int32_t step);
  // The allowed-token bitmask of `s`'s next token for device sampling row `row`, in
  // storage that lives until the next call with that row (DeviceSampleRows).
  std::span<const uint32_t> DeviceMask(const Sequence& s, size_t row);
  // Device sampling with masks: `fo` with a before_sampling hook that fills the masks
  // DeviceSampleRows reserved, while the device runs the forward pass.
  ForwardOptions WithMaskFill(ForwardOptions fo);
  void FillDeviceMasks();
  // The matcher takes the chosen token; the mask allowed only what it accepts, so a
  // refusal is a bug (abort).
  void AcceptConstrained(Sequence& s, int32_t token);
  // Speculative decoding (engine_speculative.cc): the step's tokens from host logits (each
  // verify chunk's accepted drafts and its corrected or bonus token), then the draft pass
  // (MTP slots of every sequence that reached its end, and the next drafts), then outputs.
  // With `device_tokens` (SpeculativeDeviceRows' rows) a verify row's token is the one the
  // device chose as Sample would, and a draft is accepted when it is that token.
  void EmitSpeculative(const StepPlan& plan, std::vector<float>* logits, const std::vector<int32_t>* device_tokens);
  // A drafting engine's device sampling rows (verification on the device, only token ids
  // cross): one per logits row, when the backend samples on the device and no sequence
  // reaching its end this step wants logprobs, a logit bias, tokens held back (min_tokens)
  // or a constraint. False: logits go to the host.
  bool SpeculativeDeviceRows(const StepPlan& plan, std::vector<SampleRow>* rows);
  // Adds `t` (which the stop checker saw as `r`, and which is in s.tokens) to `out`; true
  // when the request ends with it, out's finish fields then set.
  bool AppendToOutput(Sequence& s, const SampledToken& t, const StopResult& r, RequestOutput& out);
  // An imported sequence's first draft pass (its blocks, first token and the prefill
  // replica's hidden state in place): the prompt's last MTP slot, then its drafts. False
  // when it failed: the request has ended.
  bool DraftAfterImport(std::unique_ptr<Sequence>& seq);
  // A draft pass over s's slots [first_slot, its length), within its blocks, with the
  // drafts its request may still use (none when it does not draft); hidden rows unset.
  DraftSequence DraftPassFor(const Sequence& s, int64_t first_slot) const;
  // Whether a request drafts: the engine does and it is not a prefill-only request. (A
  // constrained request drafts too: a draft its grammar refuses is never the token its
  // masked row samples, so it is refused.)
  bool Drafts(const KvSink* sink) const { return options_.speculative_tokens > 0 && sink == nullptr; }
  double Now() const { return options_.clock(); }

  EngineOptions options_;
  std::unique_ptr<ModelBackend> backend_;
  std::shared_ptr<void> host_pool_memory_;  // the host KV pool of a device backend (mmap)
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvPool> pool_;          // every stream of the layout, in one region
  std::unique_ptr<LatentKvCache> cache_;  // the latent stream of pool_, as the backends take it
  std::unique_ptr<Scheduler> scheduler_;  // engine thread only
  Sampler sampler_;                       // engine thread only
  DraftPolicy draft_policy_;              // engine thread only
  std::vector<int32_t> eos_ids_;
  uint64_t layout_fingerprint_ = 0;
  KvLayout layout_;
  bool latent_layout_ = false;  // layout_ is one per-token f32 stream on every layer (cache_ views it)
  // A device backend computing in its own pool of non-latent streams, mirrored in the host
  // pool's layout (DeepSeek-V4 on a GPU; engine_device_streams.cc).
  bool device_streams_ = false;
  std::unique_ptr<KvLeases> leases_;                 // engine thread only
  std::unique_ptr<ConstraintCompiler> constraints_;
  std::unique_ptr<cpu::ThreadPool> mask_pool_;  // FillDeviceMasks' threads (engine thread's calls only)
  std::map<std::string, std::function<void(Compiled)>> compiling_;  // engine thread only
  std::vector<uint32_t> constraint_mask_;             // engine thread only (scratch)
  std::vector<std::vector<uint32_t>> device_masks_;  // engine thread only: per sampling row
  // The rows of the last DeviceSampleRows whose masks are still to fill (engine thread).
  std::vector<std::pair<const Sequence*, size_t>> pending_masks_;
  struct KvWaiter {
    std::string id;
    int32_t num_tokens = 0;
    double deadline = 0;
    ReserveDone done;
  };
  std::deque<KvWaiter> kv_waiters_;                   // engine thread only
  std::optional<InFlight> in_flight_;                 // engine thread only
  // Advance's collected step while it launches the next and emits this one's outputs: a
  // sequence ending meanwhile (a failed launch) is dropped from it as well.
  InFlight* emitting_ = nullptr;                      // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;
  std::map<std::string, bool> live_ids_;  // ids submitted and not yet finished (guarded by mu_)
  int64_t queued_ = 0;                    // requests submitted, not yet running (guarded by mu_)
  bool stop_ = false;
  EngineStats stats_;  // guarded by mu_
  // Mirror of the prefix cache's hashes and the changes not yet taken (guarded by mu_).
  std::unordered_set<uint64_t> cached_hashes_;
  std::unordered_set<uint64_t> snapshot_hashes_;  // mirror of the scheduler's PrefixStates (guarded by mu_)
  uint64_t snapshot_version_ = 0;                 // engine thread only: the PrefixStates version mirrored
  std::vector<uint64_t> pending_stored_, pending_removed_;
  bool events_full_ = true;
  EngineStats counters_;  // engine thread's running totals
  std::thread thread_;
  std::atomic<uint64_t> seed_counter_{0x5eed};
};

}  // namespace tandem
