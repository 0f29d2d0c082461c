// Where a prefill-only request's KV goes as it is produced: the engine calls the sink on
// its thread after each layer of each step, for the positions whose KV that layer has just
// finalized (the first call of a request also covers positions that came from the prefix
// cache). The KV transfer layer implements it with remote writes; tests copy.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/model/kv_pool.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_backend.h"

namespace tandem {

struct KvSlice {
  const std::string* request_id = nullptr;
  int64_t layer = 0;
  int64_t begin = 0;  // positions [begin, end) of the request
  int64_t end = 0;
  int64_t entry_dim = 0;  // floats per position (kv_lora_rank + qk_rope_head_dim)
  LatentKvCache* cache = nullptr;
  std::span<const int32_t> block_table;

  // Position p's entry; valid during the call only.
  const float* Entry(int64_t position) const { return cache->Entry(layer, block_table, position); }
};

// A whole sequence's KV in a pool of any layout (kv_streams.h): what a prefill-only request
// of a model whose KV is not one latent stream hands over once its prompt is computed
// (its rings and states are final only then). KvPool::SequenceExtents lists the bytes.
struct KvSequenceKv {
  const std::string* request_id = nullptr;
  KvPool* pool = nullptr;
  std::span<const int32_t> block_table;
  int32_t state_slot = -1;
  int64_t num_tokens = 0;  // positions [0, num_tokens)
  // The state where the prompt's last full block before its last token ends (where a
  // later prompt's prefix can end: the kvstore tier keeps it), in its snapshot slot
  // (prefix_states.h); -1 when the engine keeps no snapshot there.
  int32_t snapshot_slot = -1;
  int64_t snapshot_tokens = 0;
};

class KvSink {
 public:
  virtual ~KvSink() = default;
  // Must not block for long: it runs between two layers of the forward pass. Called only
  // when wants_host_kv().
  virtual void OnLayerKv(const KvSlice& slice) = 0;
  // Device to device: a writer of the engine's backend into a peer's device pool; the
  // engine hands it each layer's new positions (on the device, no host copy).
  virtual PeerKvWriter* peer_writer() { return nullptr; }
  // Whether OnLayerKv wants the entries on the host (a device backend copies each layer
  // into the host pool first, synchronously).
  virtual bool wants_host_kv() const { return true; }
  // Layouts other than one latent stream: the engine calls OnSequenceKv once, on its
  // thread, after the step that computed the prompt's last token, instead of OnLayerKv. A
  // sink that cannot take it says so, and such a request is refused (UNIMPLEMENTED).
  virtual bool takes_sequence_kv() const { return false; }
  virtual void OnSequenceKv(const KvSequenceKv&) {}
};

}  // namespace tandem
