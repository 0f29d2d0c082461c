// Prefix imports for a layout with per-sequence streams (DeepSeek-V4): an import
// (prefix_kv.h) brings, besides block images, the state where it ends, which the engine
// checks at Submit and copies into the sequence's slot with the blocks at admission.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"

namespace tandem {

absl::Status Engine::ValidateImportedState(const PrefixKv& p, std::span<const uint64_t> chain) const {
  size_t bytes = 0;
  for (const std::span<const std::byte>& piece : p.state) bytes += piece.size();
  if (latent_layout_) {
    if (bytes == 0) return absl::OkStatus();
    return absl::InvalidArgumentError("prefix_kv: a state for a layout without per-sequence streams");
  }
  const int64_t want = pool_->StateImageBytes();
  if (static_cast<int64_t>(bytes) != want) {
    return absl::InvalidArgumentError(absl::StrCat("prefix_kv: the state where the import ends has ", bytes,
                                                   " bytes; this layout's is ", want));
  }
  const int32_t end = p.end_block();
  if (end < 1 || p.state_hash != chain[static_cast<size_t>(end) - 1]) {
    return absl::InvalidArgumentError(absl::StrCat("prefix_kv: the state is not this prompt's at block ", end));
  }
  return absl::OkStatus();
}

int64_t Engine::CopyImportedPrefixAndState(Sequence& s, absl::Status* device_error) {
  const PrefixKv& p = *s.prefix_kv;
  const size_t block_bytes = static_cast<size_t>(pool_->BlockImageBytes());
  for (int32_t b = s.import_begin; b < s.import_end; ++b) {
    const auto* src = reinterpret_cast<const std::byte*>(p.blocks[static_cast<size_t>(b - p.first_block)]);
    const std::span<const std::byte> from[] = {std::span<const std::byte>(src, block_bytes)};
    CopyConcatenated(from, pool_->BlockImage(s.blocks[static_cast<size_t>(b)]));
  }
  CopyConcatenated(p.state, pool_->StateImage(s.state_slot));
  if (device_streams_) device_error->Update(ImportedPrefixToDevice(s));
  // Kept as a snapshot, so that the next request with this prefix finds it here.
  const int32_t snapshot = scheduler_->prefix_states().Put(p.state_hash);
  if (snapshot >= 0) CopyStateSlot(s.state_slot, snapshot, /*to_host=*/false);
  const int64_t tokens = static_cast<int64_t>(s.import_end - s.import_begin) * pool_->geometry().block_size;
  s.import_begin = s.import_end = 0;
  s.import_state = false;
  s.prefix_kv.reset();
  return tokens;
}

}  // namespace tandem
