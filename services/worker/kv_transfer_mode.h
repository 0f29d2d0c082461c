// --kv-transfer: how a prefill replica's KV reaches a decode replica.
//   auto      device to device (CUDA IPC) when both replicas' models are on GPUs of one
//             machine that can reach each other, else the transfer layer (UCX);
//   transfer  always the transfer layer, through the host pools;
//   cuda-ipc  always device to device: a request that cannot go that way fails (tests,
//             and deployments that must never stage KV through the host).
#pragma once

#include <optional>
#include <string>

namespace tandem {

enum class KvTransferMode { kAuto, kTransfer, kCudaIpc };

inline std::optional<KvTransferMode> ParseKvTransferMode(const std::string& s) {
  if (s == "auto") return KvTransferMode::kAuto;
  if (s == "transfer" || s == "ucx") return KvTransferMode::kTransfer;
  if (s == "cuda-ipc") return KvTransferMode::kCudaIpc;
  return std::nullopt;
}

}  // namespace tandem
