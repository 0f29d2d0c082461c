// Engine::Create: the backend for the checkpoint, the KV layout and pools, the scheduler
// and the engine thread (engine.cc runs the loop that follows).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "engine/architectures/architectures.h"
#include "engine/model/kv_pool.h"
#include "engine/model/weights_digest.h"
#include "engine/runtime/block_hash.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/kv_layout.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const std::string& model_dir, EngineOptions options) {
  std::unique_ptr<Engine> e(new Engine());
  if (options.max_batch_tokens == 0) options.max_batch_tokens = DefaultMaxBatchTokens(options.device);
  if (!options.clock) options.clock = SteadySeconds;
  if (options.speculative_tokens < 0 || options.speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--speculative-tokens: ", options.speculative_tokens,
                                                   " is outside [0, ", kMaxSpeculativeTokens, "]"));
  }
  if (!(options.speculative_min_confidence >= 0.0f && options.speculative_min_confidence <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("--speculative-min-confidence: ",
                                                   options.speculative_min_confidence, " is outside [0, 1]"));
  }
  const bool mtp = options.speculative_tokens > 0;
  e->options_ = options;
  if (options.backend_factory) {
    ASSIGN_OR_RETURN(e->backend_, options.backend_factory(model_dir));
  } else {
    ASSIGN_OR_RETURN(e->backend_, LoadModelBackend(model_dir, {.device = options.device,
                                                          .num_threads = options.num_threads,
                                                          .gpu_memory_utilization = options.gpu_memory_utilization,
                                                          .max_batch_tokens = options.max_batch_tokens,
                                                          .max_running = options.max_running,
                                                          .kv_blocks = options.num_kv_blocks,
                                                          .batch_invariant = options.batch_invariant,
                                                          .fp8_decode = options.fp8_decode,
                                                          .fp8_prefill = options.fp8_prefill,
                                                          .mtp = mtp}));
  }
  if (mtp && !e->backend_->has_mtp()) {
    return absl::FailedPreconditionError("--speculative-tokens: the model backend has no MTP layer loaded");
  }
  ASSIGN_OR_RETURN(e->tokenizer_, Tokenizer::FromDir(model_dir));
  const ModelInfo& c = e->backend_->config();

  ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(model_dir + "/config.json"));
  // The weights' digest reads every weight file once (weights_digest.h). A fake backend from
  // options.backend_factory may run on a directory without weights (benchmarks): its
  // fingerprint then covers config.json alone.
  absl::StatusOr<uint64_t> weights = WeightsDigest(model_dir);
  if (!weights.ok() && !(weights.status().code() == absl::StatusCode::kNotFound && options.backend_factory)) {
    return weights.status();
  }
  ASSIGN_OR_RETURN(const KvLayout layout, KvLayoutFor(config_text, weights.ok() ? *weights : 0, {.mtp = mtp}));
  // Layer-by-layer KV export and prefix KV import move one per-token float32 stream on
  // every layer (LatentKvCache, DeepSeek-V2/V3). A model whose KV has other streams
  // (DeepSeek-V4) exports and imports whole sequences (KvSink::OnSequenceKv), and its
  // prefix cache restores the per-sequence streams from snapshots (prefix_states.h).
  e->latent_layout_ = layout.streams.size() == 1 && layout.streams[0].granularity == KvGranularity::kPerToken &&
                      layout.streams[0].dtype == "f32" && layout.streams[0].layers.size() == size_t(layout.num_layers);
  // A device backend over other streams (DeepSeek-V4 on the GPU) computes in its own pool,
  // which mirrors the host pool's layout: what is exported, imported or snapshotted moves
  // between the two (engine_device_streams.cc).
  e->device_streams_ = !e->latent_layout_ && !e->backend_->kv_in_host_pool();
  // Data-parallel ranks hold equal ranges of the pool's blocks; num_kv_blocks and
  // kv_cache_bytes size one rank's (the group's shared memory is sized so).
  const int64_t dp = e->backend_->data_parallel_ranks();
  int64_t blocks = options.num_kv_blocks * dp;
  const int64_t block_bytes = BlockBytes(layout);
  // Rings and states (per-sequence streams) have a slot per running sequence, and as many
  // again for KV reservations that prefill replicas write into (state_slots.h); then the
  // prefix cache's snapshots of them.
  const int64_t state_bytes = SequenceStateBytes(layout.streams);
  const int64_t running_slots = state_bytes > 0 ? 2 * int64_t{options.max_running} : 0;
  int64_t snapshots = 0;
  if (state_bytes > 0 && options.enable_prefix_cache) {
    snapshots = options.prefix_state_snapshots < 0 ? options.max_running : options.prefix_state_snapshots;
  }
  if (state_bytes > 0 && snapshots == 0) {
    e->options_.enable_prefix_cache = false;
    options.enable_prefix_cache = false;
  }
  const int64_t slots = running_slots + snapshots;
  // (Slots mean a stream layout, which runs over the host pool: checked above.)
  if (slots > 0 && options.kv_memory == nullptr && options.num_kv_blocks <= 0 &&
      slots * state_bytes + block_bytes > options.kv_cache_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV cache of ", options.kv_cache_bytes >> 20, " MiB does not hold ", slots, " sequence slots of ",
        state_bytes, " bytes (2 x max_running for running sequences and reservations, ", snapshots,
        " prefix state snapshots) and one block of ", block_bytes, " bytes: raise --kv-cache-mb or lower "
        "--max-running / --prefix-state-snapshots"));
  }
  // A rank group's host pool lives in memory its ranks share (model_backend.h): a decode
  // replica's transport registers that memory and passes it back here.
  const std::span<std::byte> shared = e->backend_->shared_host_pool();
  if (!shared.empty()) {
    if (options.kv_memory != nullptr && reinterpret_cast<std::byte*>(options.kv_memory) != shared.data()) {
      return absl::InvalidArgumentError("the KV memory given is not the memory the rank group shares");
    }
    options.kv_memory = reinterpret_cast<float*>(shared.data());
    options.kv_memory_bytes = shared.size();
  }
  if (options.kv_memory != nullptr) {
    // What does not grow with the blocks (the slots) comes off the memory first: the pool
    // of one block less that block's bytes. The streams' alignment padding may grow with
    // the blocks, so the estimate is checked down to a pool that fits.
    auto pool_bytes = [&](int64_t n) {
      return KvPool::BytesFor(layout.streams, {.num_layers = layout.num_layers, .block_size = layout.block_size,
                                               .num_blocks = n, .num_sequence_slots = slots});
    };
    ASSIGN_OR_RETURN(const size_t one_block, pool_bytes(1));
    const int64_t fixed = static_cast<int64_t>(one_block) - block_bytes;
    int64_t fit = std::max<int64_t>(0, static_cast<int64_t>(options.kv_memory_bytes) - fixed) / block_bytes;
    while (fit > 0) {
      ASSIGN_OR_RETURN(const size_t need, pool_bytes(fit));
      if (need <= options.kv_memory_bytes) break;
      --fit;
    }
    if (blocks <= 0 || blocks > fit) blocks = fit;
    if (blocks < 1) return absl::InvalidArgumentError("the KV memory given is smaller than one block");
  }
  const bool device = !e->backend_->kv_in_host_pool();
  if (blocks <= 0) {
    // A device backend's pool is sized by the device's memory; the host pool mirrors it.
    // The host pool's budget holds the sequence slots too.
    blocks = device ? e->backend_->device_kv_blocks()
                    : dp * std::max<int64_t>(1, (options.kv_cache_bytes - slots * state_bytes) / block_bytes);
  }
  if (device && e->backend_->device_kv_blocks() > 0) blocks = std::min(blocks, e->backend_->device_kv_blocks());
  blocks -= blocks % dp;
  if (blocks < 1) return absl::ResourceExhaustedError("no room for a single KV cache block");
  if (blocks > (1 << 30)) return absl::InvalidArgumentError("KV cache too large");
  const KvPool::Geometry geometry{.num_layers = layout.num_layers, .block_size = layout.block_size,
                                  .num_blocks = blocks, .num_sequence_slots = slots};
  ASSIGN_OR_RETURN(const size_t pool_bytes, KvPool::BytesFor(layout.streams, geometry));
  std::span<std::byte> memory;
  if (options.kv_memory != nullptr) {
    memory = {reinterpret_cast<std::byte*>(options.kv_memory), options.kv_memory_bytes};
  } else if (device) {
    // Only the blocks that KV export/import touch ever get pages: an untouched anonymous
    // mapping costs no memory.
    void* m = ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return absl::ResourceExhaustedError("cannot map the host KV pool");
    e->host_pool_memory_ = std::shared_ptr<void>(m, [pool_bytes](void* p) { ::munmap(p, pool_bytes); });
    memory = {static_cast<std::byte*>(m), pool_bytes};
  }
  if (memory.empty()) {
    ASSIGN_OR_RETURN(e->pool_, KvPool::Create(layout.streams, geometry));
  } else {
    ASSIGN_OR_RETURN(e->pool_, KvPool::CreateOver(memory, layout.streams, geometry));
  }
  // KV export and import read and write the one latent stream through LatentKvCache, a
  // view of the pool with the same geometry (kv_pool.h).
  if (e->latent_layout_) e->cache_ = std::make_unique<LatentKvCache>(LatentKvCache::Of(*e->pool_));
  // The device pool that mirrors it, now: a decode replica offers it to prefill replicas
  // (ShareKvPool) before any step.
  if (e->device_streams_) RETURN_IF_ERROR(e->backend_->PrepareDevicePool(geometry));

  e->layout_fingerprint_ = LayoutFingerprint(layout);
  e->layout_ = layout;

  for (int64_t id : c.eos_token_ids) e->eos_ids_.push_back(static_cast<int32_t>(id));
  if (auto eos = e->tokenizer_->eos_id(); eos && std::find(e->eos_ids_.begin(), e->eos_ids_.end(), *eos) == e->eos_ids_.end()) {
    e->eos_ids_.push_back(*eos);
  }
  SchedulerOptions so{.block_size = static_cast<int32_t>(kKvBlockSize), .max_batch_tokens = options.max_batch_tokens,
                      .max_running = options.max_running, .enable_prefix_cache = options.enable_prefix_cache,
                      .layout_fingerprint = e->layout_fingerprint_,
                      .num_state_slots = static_cast<int32_t>(running_slots),
                      .num_prefix_states = static_cast<int32_t>(snapshots),
                      .decode_state_snapshots = options.decode_state_snapshots,
                      .mtp = mtp,
                      .speculative_tokens = options.speculative_tokens,
                      .data_parallel_ranks = e->backend_->data_parallel_ranks()};
  if (so.data_parallel_ranks > 1 && (running_slots > 0 || mtp)) {
    return absl::FailedPreconditionError(
        "data-parallel attention runs layouts of one latent stream without speculative decoding only "
        "(docs/parallel.md)");
  }
  e->counters_.spec_accepted_by_position.assign(static_cast<size_t>(options.speculative_tokens), 0);
  e->counters_.spec_accepted_length.assign(static_cast<size_t>(options.speculative_tokens + (mtp ? 1 : 0)), 0);
  if (so.max_batch_tokens <= 0 || so.max_running <= 0 || options.max_waiting <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens, max_running and max_waiting must be positive");
  }
  e->scheduler_ = std::make_unique<Scheduler>(so, static_cast<int32_t>(blocks / dp));
  std::random_device random;
  const uint64_t first_token = (uint64_t{random()} << 32) | random();
  // Reservations take the blocks of one rank's pool each (the sequence's rank once admitted).
  std::vector<BlockManager*> pools;
  for (int32_t r = 0; r < e->scheduler_->num_pools(); ++r) pools.push_back(&e->scheduler_->pool(r));
  e->leases_ = std::make_unique<KvLeases>(std::move(pools), options.kv_lease_seconds,
                                          options.kv_quarantine_stuck_seconds, first_token,
                                          running_slots > 0 ? &e->scheduler_->state_slots() : nullptr);
  e->seed_counter_ = random();
  e->constraints_ = std::make_unique<ConstraintCompiler>(
      e->tokenizer_.get(), e->eos_ids_,
      ConstraintCompilerOptions{.timeout = absl::Seconds(options.grammar_compile_timeout_s)});
  int mask_threads = options.grammar_mask_threads;
  if (mask_threads <= 0) mask_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8);
  e->mask_pool_ = std::make_unique<cpu::ThreadPool>(mask_threads);
  e->PublishStats();
  e->thread_ = std::thread([raw = e.get()] { raw->Loop(); });
  return e;
}

Engine::~Engine() {
  // First the compile thread: what it finishes or drops is posted to the engine thread,
  // which ends those requests.
  if (constraints_) constraints_->Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem
