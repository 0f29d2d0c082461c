// The bf16-weight matmul's row kernels, one per instruction set (kernels/cpu/cpu_isa.h),
// for Matmul (kernels/cpu/matmul.h) and the tests that hold the variants to each other.
//
// Every variant computes each output element in the same order, a function of K alone:
//   1. eight partial sums P[j] (j < 8), each a chain of fused multiply-adds over
//      k = j, j + 8, j + 16, ... below K8 = K rounded down to 8, in increasing k, from 0;
//   2. R[j] = P[j] + P[j + 4] (j < 4), then (R[0] + R[1]) + (R[2] + R[3]);
//   3. fused multiply-adds of the remaining k in [K8, K), in increasing k;
//   4. stored, or added to y (one addition).
// So a row's output bits do not depend on m, on which rows share a thread or a register
// block, on the thread count, or on the variant: the engine's batch invariance rests on
// the first three, and the last lets the variants be tested bitwise against one scalar
// reference. (It is the order the AVX2 loop had before the variants: 8-lane accumulators
// and that reduction tree; only its tail, K not a multiple of 8, now fuses explicitly.)
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"

namespace tandem::cpu {

// y[t, r] (+)= x[t, :] . w[r, :] for t < p.m and r in [row_begin, row_end); p.w is bf16.
using Bf16RowsKernel = void (*)(const MatmulParams& p, int64_t row_begin, int64_t row_end);

Bf16RowsKernel Bf16RowsKernelFor(CpuIsa isa);  // isa must be supported

// The variants (matmul_bf16_{generic,avx2,avx512}.cc); the avx2 and avx512 ones exist
// on x86-64 only.
void Bf16RowsGeneric(const MatmulParams& p, int64_t row_begin, int64_t row_end);
void Bf16RowsAvx2(const MatmulParams& p, int64_t row_begin, int64_t row_end);
void Bf16RowsAvx512(const MatmulParams& p, int64_t row_begin, int64_t row_end);

}  // namespace tandem::cpu
