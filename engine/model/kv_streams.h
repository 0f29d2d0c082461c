// What a model keeps per sequence to continue it, described so that code which knows no
// architecture can page, hash, move and store it (docs/model-neutral-engine.md): per
// layer a set of named streams, each of entries of `width` values of one dtype, at one
// granularity. DeepSeek-V2/V3 have one stream (`latent`, one entry per token); DeepSeek-V4
// has a sliding-window ring, compressed entries per window of N tokens, indexer keys and
// its compressors' unfinished windows. An architecture declares its streams from its
// config (engine/architectures); the KV layout and its fingerprint carry them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

// The values are part of the KV layout fingerprint's encoding (block_hash.h): never
// renumber.
enum class KvGranularity : int32_t {
  kPerToken = 0,       // entry p for token position p (paged, in the token's block)
  kPerWindow = 1,      // entry p / tokens, written when window p / tokens closes (paged)
  kRing = 2,           // the last `tokens` tokens' entries, slot p % tokens (per sequence)
  kSequenceState = 3,  // `tokens` rows overwritten as tokens arrive (per sequence)
};

const char* KvGranularityName(KvGranularity g);

struct KvStream {
  std::string name;
  std::string dtype;  // "f32", "bf16", "fp8_e4m3"
  KvGranularity granularity = KvGranularity::kPerToken;
  // Per token: 1. Per window: the tokens of one window. Ring: the tokens held. State: rows.
  int32_t tokens = 1;
  int32_t width = 0;            // values per entry (row)
  std::vector<int32_t> layers;  // the decoder layers that have this stream, ascending
};

// What an architecture declares for one config (engine/architectures).
struct ModelKvStreams {
  int32_t num_layers = 0;  // decoder layers
  std::vector<KvStream> streams;
};

// Bytes of one value of `dtype`; 0 for a dtype this build does not know.
int64_t KvDtypeBytes(const std::string& dtype);

// Paged streams live in the shared token blocks (prefix caching, the kvstore, the
// prefill -> decode block transfer); the others travel with their sequence.
bool IsPaged(const KvStream& s);

// The entries of a paged stream one block of `block_size` tokens holds, per layer: a
// window of N <= block_size tokens gives block_size / N; a window longer than a block
// gives one slot, used in the block holding the window's last token.
int64_t EntriesPerBlock(const KvStream& s, int32_t block_size);

// A stream set that paging can hold: names unique and non-empty, known dtypes, positive
// widths and token counts, per-token streams with tokens 1, windows that divide or are
// multiples of block_size, layers ascending, unique and below num_layers. Errors are
// INVALID_ARGUMENT naming the stream and the field.
absl::Status ValidateKvStreams(const std::vector<KvStream>& streams, int32_t num_layers, int32_t block_size);

// Bytes of one token block over every paged stream and layer.
int64_t PagedBytesPerBlock(const std::vector<KvStream>& streams, int32_t block_size);
// Bytes a sequence carries outside the blocks (rings and states), over every layer.
int64_t SequenceStateBytes(const std::vector<KvStream>& streams);

// One line for logs: "latent: per token x 576 f32 on 27 layers; ...".
std::string DescribeKvStreams(const std::vector<KvStream>& streams);

}  // namespace tandem
