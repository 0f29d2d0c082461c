#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <string>

namespace tandem::cpu {

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool CpuIsaSupported(CpuIsa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  switch (isa) {
    case CpuIsa::kGeneric:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == CpuIsa::kGeneric;
#endif
}

CpuIsa DetectedCpuIsa() {
  static const CpuIsa detected = [] {
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
      if (CpuIsaSupported(isa)) return isa;
    }
    return CpuIsa::kGeneric;
  }();
  return detected;
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa active = [] {
    const CpuIsa detected = DetectedCpuIsa();
    const char* v = std::getenv("TANDEM_CPU_ISA");
    if (v == nullptr || *v == '\0') return detected;
    const std::string want(v);
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kGeneric}) {
      if (want != CpuIsaName(isa)) continue;
      // Asked for more than the CPU has: the best it has below the request.
      return static_cast<int>(isa) <= static_cast<int>(detected) ? isa : detected;
    }
    return detected;  // an unknown name changes nothing
  }();
  return active;
}

bool CpuIsaFromEnvironment() {
  static const bool set = [] {
    const char* v = std::getenv("TANDEM_CPU_ISA");
    return v != nullptr && *v != '\0';
  }();
  return set;
}

}  // namespace tandem::cpu
