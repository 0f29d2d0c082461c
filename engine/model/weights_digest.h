// The digest of a checkpoint's weights, part of the model's identity in the KV layout
// fingerprint (engine/runtime/kv_layout.h): two fine-tunes of one base share config.json
// and every safetensors header (names, dtypes, shapes, offsets) and differ only in tensor
// bytes, so only a digest of those bytes tells their KV apart.
//
// It is XXH3-64 over every byte of the weight files — the headers and all tensor data —
// in a canonical order (shard file names sorted; each file's name and length first), so
// the same checkpoint gives the same digest wherever it lies. It must be the full bytes:
// a sample of each tensor would miss a fine-tune that changes only some rows (new token
// embeddings, a LoRA merged into part of a matrix). The cost is one sequential read of
// the weights at startup, which loading reads anyway (a GPU backend copies every byte to
// the device; the CPU backend touches every page in its first steps). XXH3 ran at 5.5-6.3
// GB/s per second of CPU time here (1 GiB in memory, one core of this 2-core build machine
// under load): about 3 s of one core for a 16 GB checkpoint in the page cache; a cold
// start is bound by the disk, as loading already was.
//
// A checkpoint whose weights are generated at load (checkpoint.h's kGeneratedWeightsFile)
// is identified by that file, whose seed decides every weight.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// Errors: NOT_FOUND (no weight files in `model_dir`), INVALID_ARGUMENT (a malformed
// model.safetensors.index.json), file system errors.
absl::StatusOr<uint64_t> WeightsDigest(const std::string& model_dir);

}  // namespace tandem
