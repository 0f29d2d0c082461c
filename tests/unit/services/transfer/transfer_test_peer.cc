// A peer process for the two-process UCX transfer tests (the receiving side, like a decode
// replica). Usage: transfer_test_peer BYTES [--register]
//
// Creates a UcxTransferEngine (transports from the environment), allocates a zeroed buffer
// of BYTES bytes with AllocateMemory (with --register: a heap buffer, RegisterMemory) and
// prints "DESC <hex of the serialized descriptor>". Then it answers
// commands on stdin, one per line:
//   VERIFY <seed> <n> <offset> <length> ...   -> "OK" or "BAD <where>": bytes inside the
//       ranges must follow the test pattern, every other byte must be zero
//   CLEAR                                     -> zeroes the buffer, "OK"
//   QUIT (or end of input)                    -> exits 0
// Every answer line starts with "TPEER " (UCX logs to stdout too: the reader skips the rest).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "services/common/transfer/ucx_transfer_engine.h"
#include "tests/unit/services/transfer/transfer_test_pattern.h"

using tandem::transfer::UcxTransferEngine;
namespace testing = tandem::transfer::testing;

int main(int argc, char** argv) {
  uint64_t size = 0;
  const bool register_memory = argc == 3 && std::string(argv[2]) == "--register";
  if (argc < 2 || argc > 3 || (argc == 3 && !register_memory) ||
      !absl::SimpleAtoi(argv[1], &size) || size == 0) {
    std::fprintf(stderr, "usage: transfer_test_peer BYTES [--register]\n");
    return 2;
  }
  auto engine = UcxTransferEngine::Create();
  if (!engine.ok()) {
    std::fprintf(stderr, "transfer_test_peer: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> heap;
  absl::StatusOr<std::unique_ptr<tandem::transfer::MemoryRegion>> region;
  if (register_memory) {
    heap.assign(size, 0);
    region = (*engine)->RegisterMemory(heap.data(), heap.size());
  } else {
    region = (*engine)->AllocateMemory(size);
  }
  if (!region.ok()) {
    std::fprintf(stderr, "transfer_test_peer: %s\n", region.status().ToString().c_str());
    return 1;
  }
  auto* data = static_cast<uint8_t*>((*region)->base());
  std::cout << "TPEER DESC " << absl::BytesToHexString((*region)->descriptor().Serialize())
            << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "QUIT") break;
    if (line == "CLEAR") {
      std::memset(data, 0, size);
      std::cout << "TPEER OK" << std::endl;
    } else if (line.rfind("VERIFY ", 0) == 0) {
      uint64_t seed = 0;
      std::vector<testing::Range> ranges;
      if (!testing::DecodeRanges(line.substr(7), seed, ranges)) {
        std::cout << "TPEER BAD malformed VERIFY" << std::endl;
        continue;
      }
      const std::string error = testing::VerifyPattern(data, size, seed, ranges);
      std::cout << "TPEER " << (error.empty() ? std::string("OK") : "BAD " + error) << std::endl;
    } else {
      std::cout << "TPEER BAD unknown command" << std::endl;
    }
  }
  // Engine first: once its progress thread stopped nothing can write into the region (over
  // tcp, puts of a sender that gave up may still be in flight), then the region.
  engine->reset();
  region->reset();
  return 0;
}
