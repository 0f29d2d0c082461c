#include "services/common/transfer/checksum.h"

#include <xxhash.h>

#include "kernels/common/check.h"

namespace tandem::transfer {

uint64_t Checksum(const void* data, size_t length, uint64_t seed) {
  return XXH3_64bits_withSeed(data, length, seed);
}

struct ChecksumBuilder::State {
  XXH3_state_t* xxh = nullptr;
};

ChecksumBuilder::ChecksumBuilder(uint64_t seed) : state_(std::make_unique<State>()) {
  state_->xxh = XXH3_createState();
  TANDEM_CHECK(state_->xxh != nullptr) << "XXH3_createState failed";
  TANDEM_CHECK(XXH3_64bits_reset_withSeed(state_->xxh, seed) == XXH_OK);
}

ChecksumBuilder::~ChecksumBuilder() { XXH3_freeState(state_->xxh); }

void ChecksumBuilder::Update(const void* data, size_t length) {
  TANDEM_CHECK(XXH3_64bits_update(state_->xxh, data, length) == XXH_OK);
}

uint64_t ChecksumBuilder::Digest() const { return XXH3_64bits_digest(state_->xxh); }

}  // namespace tandem::transfer
