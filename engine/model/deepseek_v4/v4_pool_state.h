// A V4 sequence's state (v4_state.h) in a KV pool of its streams (v4_kv_streams.h,
// engine/model/kv_pool.h) and back: what a paged V4 backend computes in, and what moves
// between replicas. Exact: a state stored and loaded continues bit for bit as the
// original would (engine_model_v4_pool_state_test).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_state.h"
#include "engine/model/kv_pool.h"

namespace tandem::v4 {

// Writes into `pool` (made from KvStreamsFor(config)) the compressed entries and indexer
// keys of the windows that closed at positions [from_token, state.num_tokens), into the
// blocks of `block_table`, and the whole ring and compressor states into sequence slot
// `slot`. Entries of earlier windows are taken to be in the pool already.
void StoreState(const DeepseekV4Config& config, const SequenceState& state, int64_t from_token, KvPool& pool,
                std::span<const int32_t> block_table, int64_t slot);

// Fills `state` (a fresh one, DeepseekV4Model::NewSequence) with the first `num_tokens`
// positions' state from the pool: what StoreState wrote for them.
void LoadState(const DeepseekV4Config& config, KvPool& pool, std::span<const int32_t> block_table, int64_t slot,
               int64_t num_tokens, SequenceState* state);

// Speculative decoding (a pool of KvStreamsFor(config, /*mtp=*/true)): the MTP layer's
// ring in slot `slot` (the window stream's layer num_hidden_layers), and the hidden
// streams of the sequence's last position ([hc_mult * hidden_size], the mtp_hidden stream).
void StoreMtpRing(const DeepseekV4Config& config, const LayerState& ring, KvPool& pool, int64_t slot);
void LoadMtpRing(const DeepseekV4Config& config, KvPool& pool, int64_t slot, LayerState* ring);
void StoreLastHidden(const DeepseekV4Config& config, std::span<const float> hidden, KvPool& pool, int64_t slot);
std::vector<float> LoadLastHidden(const DeepseekV4Config& config, KvPool& pool, int64_t slot);

}  // namespace tandem::v4
