// Which instruction set the CPU kernels with several compiled variants use (the bf16
// matmul, kernels/cpu/matmul_bf16.h). The library is compiled for the baseline
// (TANDEM_CPU_ARCH, x86-64-v3 by default); wider variants carry target attributes and are
// chosen at run time by cpuid, so one binary runs on every x86-64 machine of the baseline
// and uses AVX-512 where it exists.
//
// TANDEM_CPU_ISA=generic|avx2|avx512 overrides the choice (A/B runs, tests); a variant the
// CPU or the build lacks falls back to the best one below it.
#pragma once

#include <string_view>

namespace tandem::cpu {

enum class CpuIsa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view CpuIsaName(CpuIsa isa);

// Whether this build has the variant and this CPU can run it (kGeneric always).
bool CpuIsaSupported(CpuIsa isa);

// The best supported variant.
CpuIsa DetectedCpuIsa();

// What the kernels use: DetectedCpuIsa(), or TANDEM_CPU_ISA clamped to what is supported.
// Read once per process.
CpuIsa ActiveCpuIsa();
// Whether TANDEM_CPU_ISA named the variant (then every matrix uses it, for A/B runs).
bool CpuIsaFromEnvironment();

}  // namespace tandem::cpu
