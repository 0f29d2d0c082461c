// DeepSeek-V4's KV streams (engine/model/kv_streams.h) from its config: what
// v4::SequenceState (v4_state.h) holds, stream by stream, so that the paged cache, the
// transfer and the fingerprint can carry it without knowing V4.
#pragma once

#include <vector>

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/kv_streams.h"

namespace tandem::v4 {

// In this order, each present only when some layer has it:
//   window             ring of sliding_window K=V vectors [head_dim], every layer;
//   csa_entries        per window of compress_rate_csa tokens [head_dim], CSA layers;
//   csa_index_keys     per window of compress_rate_csa tokens [index_head_dim], CSA layers;
//   hca_entries        per window of compress_rate_hca tokens [head_dim], HCA layers;
//   csa_compressor     state rows of [head_dim]: the unfinished window's kv and gate rows
//                      (rate - 1 rows of 2 x head_dim each) and the last complete window's
//                      overlap half (rate rows each): 6 x rate - 4 rows;
//   csa_indexer        the same for the indexer at index_head_dim;
//   hca_compressor     state rows of [head_dim]: the unfinished window's kv and gate rows,
//                      2 x (rate - 1).
// With `mtp` (speculative decoding with the checkpoint's MTP layer, whose attention is a
// sliding window: docs/speculative-decoding.md) the window stream also has the MTP layer,
// layer num_hidden_layers, its ring indexed by MTP position (the main model's position
// of the hidden state it reads), and one more stream follows:
//   mtp_hidden         state rows of [hidden_size], on the MTP layer: the hc_mult hidden
//                      streams of the sequence's last position after the last decoder
//                      layer, which the MTP layer reads with the next token (so a state
//                      restored or moved continues drafting without recomputing it).
// Values are float32, as the CPU reference keeps them.
std::vector<KvStream> KvStreamsFor(const DeepseekV4Config& config, bool mtp = false);

}  // namespace tandem::v4
