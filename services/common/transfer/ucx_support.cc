#include "services/common/transfer/ucx_support.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::transfer::internal {

absl::Status FromUcs(ucs_status_t status, std::string_view what) {
  std::string message = absl::StrCat(std::string(what), ": ", ucs_status_string(status));
  switch (status) {
    case UCS_OK:
      return absl::OkStatus();
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NOT_IMPLEMENTED:
      return absl::UnimplementedError(message);
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_SOME_CONNECTS_FAILED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_SHMEM_SEGMENT:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_CONNECTION_RESET:
      return absl::UnavailableError(message);
    default:
      if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
        return absl::UnavailableError(message);
      }
      return absl::InternalError(message);
  }
}

std::string ErrnoMessage(std::string_view what) {
  return absl::StrCat(std::string(what), ": ", std::strerror(errno));
}

namespace {
// Pieces of kStreamMin bytes up to kLibcStreamsFrom use non-temporal stores (the data is
// for another process): glibc's memcpy streams only far larger copies. Measured here (2
// cores, 64 MiB moved): in 147,456-byte pieces memcpy 6.2 GB/s, SSE2 streaming 6.7, AVX
// streaming 7.8; as one 64 MiB copy memcpy 10.0 (its large-copy path), AVX streaming 8.1.
constexpr size_t kStreamMin = 64 * 1024;
constexpr size_t kLibcStreamsFrom = 32 * 1024 * 1024;
}  // namespace

void CopyToMapped(char* dst, const void* src_void, size_t n) {
  const char* src = static_cast<const char*>(src_void);
#if defined(__x86_64__)
  if (n >= kStreamMin && n < kLibcStreamsFrom) {
#if defined(__AVX__)
    using Vec = __m256i;
#define TANDEM_LOAD(p) _mm256_loadu_si256(reinterpret_cast<const Vec*>(p))
#define TANDEM_STREAM(p, v) _mm256_stream_si256(reinterpret_cast<Vec*>(p), v)
#else
    using Vec = __m128i;
#define TANDEM_LOAD(p) _mm_loadu_si128(reinterpret_cast<const Vec*>(p))
#define TANDEM_STREAM(p, v) _mm_stream_si128(reinterpret_cast<Vec*>(p), v)
#endif
    constexpr size_t kVec = sizeof(Vec);
    const size_t head = (kVec - (reinterpret_cast<uintptr_t>(dst) & (kVec - 1))) & (kVec - 1);
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + 4 * kVec <= n; i += 4 * kVec) {
      const Vec a = TANDEM_LOAD(src + i);
      const Vec b = TANDEM_LOAD(src + i + kVec);
      const Vec c = TANDEM_LOAD(src + i + 2 * kVec);
      const Vec d = TANDEM_LOAD(src + i + 3 * kVec);
      TANDEM_STREAM(dst + i, a);
      TANDEM_STREAM(dst + i + kVec, b);
      TANDEM_STREAM(dst + i + 2 * kVec, c);
      TANDEM_STREAM(dst + i + 3 * kVec, d);
    }
#undef TANDEM_LOAD
#undef TANDEM_STREAM
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void StoreFence() {
#if defined(__x86_64__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

bool TlsIncludesTcp(const std::string& tls) {
  if (tls.empty()) return true;
  const bool exclude = tls[0] == '^';
  bool named = false, all = false;
  size_t pos = exclude ? 1 : 0;
  while (pos <= tls.size()) {
    size_t comma = tls.find(',', pos);
    if (comma == std::string::npos) comma = tls.size();
    const std::string item = tls.substr(pos, comma - pos);
    named |= item == "tcp";
    all |= item == "all";
    pos = comma + 1;
  }
  return exclude ? !named : (named || all);
}


absl::Status CheckSharedMappingIn(std::string_view maps, uintptr_t p, uint64_t length) {
  // Lines: "start-end perms offset dev inode [path]", addresses in hex, sorted.
  for (absl::string_view line : absl::StrSplit(absl::string_view(maps.data(), maps.size()), '\n')) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash == absl::string_view::npos || space == absl::string_view::npos || dash > space) continue;
    uint64_t start = 0, end = 0;
    if (!absl::SimpleHexAtoi(line.substr(0, dash), &start) ||
        !absl::SimpleHexAtoi(line.substr(dash + 1, space - dash - 1), &end) || p < start || p >= end) {
      continue;
    }
    const absl::string_view perms = line.substr(space + 1, 4);
    if (perms.size() != 4 || perms[1] != 'w' || perms[3] != 's') {
      return absl::InvalidArgumentError(absl::StrCat("the destination maps to ", line,
                                                     ": not a shared, writable mapping"));
    }
    if (length > end - p) {
      return absl::InvalidArgumentError(absl::StrCat("the destination claims ", length, " bytes; the shared "
                                                     "memory mapped there holds ", end - p, " (", line, ")"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("the destination maps to address 0x", absl::Hex(p),
                                                 ", which nothing in this process maps"));
}

absl::Status CheckSharedMapping(const void* p, uint64_t length) {
  std::ifstream f("/proc/self/maps");
  if (!f) return absl::InternalError(ErrnoMessage("reading /proc/self/maps"));
  std::stringstream text;
  text << f.rdbuf();
  return CheckSharedMappingIn(text.str(), reinterpret_cast<uintptr_t>(p), length);
}

}  // namespace tandem::transfer::internal
