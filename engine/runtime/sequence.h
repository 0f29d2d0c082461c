// The engine's state of one request. Owned by the scheduler; touched by the engine
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/runtime/kv_sink.h"
#include "engine/runtime/output_stream.h"
#include "engine/runtime/prefix_kv.h"
#include "engine/runtime/sampling_params.h"
#include "engine/runtime/stop_checker.h"

namespace tandem {

enum class SequenceState { kWaiting, kRunning };

inline constexpr int32_t kPendingToken = -1;  // Sequence::pending_token's placeholder

struct Sequence {
  std::string id;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  // The last entry of `tokens` is a placeholder (kPendingToken) for the token a launched,
  // not yet collected step is choosing (the engine's pipelined steps): it counts for
  // scheduling (the next step computes its position) but its value and hash come later.
  bool pending_token = false;
  int32_t prompt_len = 0;
  // Tokens whose KV is in the cache, from position 0. Drops to 0 on preemption.
  int32_t num_computed = 0;
  std::vector<int32_t> blocks;        // block table: KV blocks of positions [0, 64 * size)
  // Data-parallel attention: the rank whose KV pool `blocks` index (Scheduler::Place),
  // chosen anew whenever the sequence is admitted without blocks; 0 without.
  int32_t dp_rank = 0;
  int32_t state_slot = -1;            // the KV pool's per-sequence slot while running (or -1)
  // A prefix-cache hit on a layout with per-sequence streams: the snapshot slot
  // (prefix_states.h, pinned) the engine copies into state_slot before the next forward.
  int32_t restore_state_from = -1;
  // Where the cached blocks this sequence's prompt shares end, when no snapshot reached
  // that far (e.g. a shared system prompt followed by other text): its state is
  // snapshotted there too, for the next prompt sharing them (0: none).
  int32_t shared_prefix_end = 0;
  // The snapshot this sequence last took while decoding (SchedulerOptions::
  // decode_state_snapshots), replaced by the next one: 0 when none.
  uint64_t decode_snapshot_hash = 0;
  std::vector<uint64_t> block_hashes;  // hash chain of the full blocks of `tokens`
  int32_t num_published = 0;          // leading blocks offered to the prefix cache
  bool prefix_looked_up = false;      // the prefix cache was consulted since (re)admission
  SequenceState state = SequenceState::kWaiting;
  uint64_t arrival = 0;  // admission order (older first)

  SamplingParams sampling;
  uint64_t seed = 0;
  int32_t min_tokens = 0;               // EOS and stop tokens are not sampled before this
  int32_t max_tokens = 0;               // generated tokens at most (the stop checker's limit)
  std::vector<int32_t> stop_token_ids;
  bool queued = false;                  // counted in the engine's waiting-queue bound
  std::unique_ptr<StopChecker> stop;
  // Structured output: the constraint's state after the output so far (null: none). Its
  // rows are sampled on the host, one step at a time.
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  std::shared_ptr<OutputStream> output;

  // Prefill-only (disaggregated prefill): KV goes to `kv_sink` as produced, the request
  // ends with its first token.
  KvSink* kv_sink = nullptr;
  int64_t exported_upto = 0;

  // Prefix KV offered by the caller (prefix_kv.h), dropped once copied in. The scheduler
  // allocates blocks [import_begin, import_end) of `blocks` for it at admission; the
  // engine copies them in before the next forward pass and clears the range.
  std::shared_ptr<const PrefixKv> prefix_kv;
  int32_t import_begin = 0;
  int32_t import_end = 0;
  // The import's state (PrefixKv::state) goes into state_slot with those blocks.
  bool import_state = false;
  // Device backends: positions [0, host_kv_upload_end) arrived in the host KV pool
  // (SubmitImported) and go to the device pool before the sequence's first step.
  int64_t host_kv_upload_end = 0;

  // Speculative decoding (docs/speculative-decoding.md): the MTP layer's guesses at the
  // tokens after `tokens`, verified by the sequence's next decode step.
  bool speculative = false;  // this request drafts
  std::vector<int32_t> drafts;
  // After a prefix hit with the MTP layer's KV: the next chunk starts at num_computed - 1
  // (ScheduledChunk::first_kv_cached).
  bool recompute_last_cached = false;
  // Decode side of disaggregation: the hidden state of the prompt's last position, from
  // the prefill replica, for the first draft pass.
  std::vector<float> imported_hidden;
  std::vector<int32_t> verify_tokens;   // engine scratch: a verify chunk's tokens
  std::vector<int32_t> verify_history;  // engine scratch: the output, then the drafts (device rows)

  RequestMetrics metrics;
  double submitted_at = 0;
  double first_scheduled_at = -1;
  double first_token_at = -1;

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(prompt_len)}; }
  std::span<const int32_t> generated() const {
    return {tokens.data() + prompt_len, tokens.size() - static_cast<size_t>(prompt_len)};
  }
};

// Generated tokens of `s` whose value is known: without the placeholder of a launched
// step (Sequence::pending_token). What the request has produced, its completion_tokens: with
// pipelined steps a sequence that ends on a token already holds the next step's
// placeholder when that token is emitted.
inline int32_t ChosenTokens(const Sequence& s) { return s.num_generated() - (s.pending_token ? 1 : 0); }

}  // namespace tandem
