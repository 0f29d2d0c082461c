// A read-only view of one stored tensor: element type, shape and its bytes (which live in
// a memory-mapped checkpoint or in a buffer owned by whoever handed out the view).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"

namespace tandem {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  const void* data() const { return bytes.data(); }
};

// "[2, 3]" for error messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace tandem
