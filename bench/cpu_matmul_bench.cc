// The bf16 matmul alone (kernels/cpu/matmul.h) at decode's shapes, per instruction-set
// variant, against the streaming read measured in the same run (bench/read_bandwidth.h):
// what the kernel leaves of the roofline before the rest of a decode step adds its share.
//
//   cpu_matmul_bench [--threads N] [--reps R] [--m M] [--json FILE]
//
// Each shape is a set of matrices of 256 MiB in all, read in turn so no matrix is in cache
// when it is read again; the time per matrix is the median over `reps` passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/read_bandwidth.h"
#include "kernels/cpu/matmul.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

struct Shape {
  const char* what;
  int64_t rows, cols;
};

int Main(int argc, char** argv) {
  int threads = 0, reps = 9;
  int64_t m = 1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--m") m = std::stoll(next());
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps R] [--m M] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  cpu::ThreadPool pool(threads);
  const double read_bw = ReadBandwidth(pool, size_t{1} << 30, 5);
  const Shape shapes[] = {{"expert gate/up 0.5B-V4", 512, 1024},  {"expert down 0.5B-V4", 1024, 512},
                          {"square 2048", 2048, 2048},            {"wide 4096x1024", 4096, 1024},
                          {"lm head 102400x1024", 102400, 1024}, {"tall 1024x7168", 1024, 7168}};
  std::vector<cpu::CpuIsa> isas;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::kGeneric, cpu::CpuIsa::kAvx2, cpu::CpuIsa::kAvx512}) {
    if (cpu::CpuIsaSupported(isa)) isas.push_back(isa);
  }
  std::mt19937 rng(1);
  nlohmann::ordered_json results = nlohmann::json::array();
  for (const Shape& s : shapes) {
    const int64_t bytes = s.rows * s.cols * 2;
    const int64_t copies = std::max<int64_t>(1, (int64_t{256} << 20) / bytes);
    std::vector<uint16_t> storage(static_cast<size_t>(copies * s.rows * s.cols));
    for (size_t i = 0; i < storage.size(); ++i) storage[i] = F32ToBf16(static_cast<float>(rng() % 2001) * 1e-3f - 1.0f);
    std::vector<cpu::WeightMatrix> ws;
    for (int64_t c = 0; c < copies; ++c) {
      ws.push_back({.dtype = DType::kBF16, .rows = s.rows, .cols = s.cols,
                    .data = reinterpret_cast<const std::byte*>(storage.data() + c * s.rows * s.cols)});
    }
    std::vector<float> x(static_cast<size_t>(m * s.cols), 0.5f), y(static_cast<size_t>(m * s.rows));
    nlohmann::ordered_json row = {{"shape", s.what}, {"rows", s.rows}, {"cols", s.cols}, {"m", m}};
    for (cpu::CpuIsa isa : isas) {
      std::vector<double> per_matrix;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const cpu::WeightMatrix& w : ws) {
          cpu::Matmul({.x = x.data(), .m = m, .x_stride = s.cols, .w = &w, .y = y.data(), .y_stride = s.rows}, pool,
                      isa);
        }
        per_matrix.push_back(SecondsBetween(t0, std::chrono::steady_clock::now()) / copies);
      }
      const double t = Percentile(per_matrix, 0.5);
      const std::string name(cpu::CpuIsaName(isa));
      row[name] = {{"us", 1e6 * t}, {"gbs", bytes / t / 1e9}, {"fraction_of_read", bytes / t / read_bw}};
      std::fprintf(stderr, "%-24s %-8s %9.1f us  %6.2f GB/s  %.2f of read\n", s.what, name.c_str(), 1e6 * t,
                   bytes / t / 1e9, bytes / t / read_bw);
    }
    results.push_back(row);
  }
  nlohmann::ordered_json out = {{"benchmark", "cpu_matmul_bf16"},
                                {"threads", pool.num_threads()},
                                {"active_isa", std::string(cpu::CpuIsaName(cpu::ActiveCpuIsa()))},
                                {"reference_read_bandwidth_gbs", read_bw / 1e9},
                                {"shapes", results}};
  std::printf("%s\n", out.dump(2).c_str());
  std::fprintf(stderr, "streaming read %.2f GB/s, %d threads\n", read_bw / 1e9, pool.num_threads());
  if (!json_path.empty()) {
    if (std::FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", out.dump(2).c_str());
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) { return tandem::bench::Main(argc, argv); }
