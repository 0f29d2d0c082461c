#include "engine/model/cuda/cuda_ipc.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include <cuda.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tandem::cuda_model {
namespace {

constexpr size_t kUuidBytes = sizeof(cudaUUID_t);
constexpr size_t kHandleBytes = sizeof(cudaIpcMemHandle_t);
static_assert(kUuidBytes == 16 && kHandleBytes == 64);

std::string CudaText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// Makes `device` current for a scope and restores the device that was current before.
class ScopedDevice {
 public:
  ScopedDevice() {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && previous_ != current_) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t Set(int device) {
    const cudaError_t err = cudaSetDevice(device);
    if (err == cudaSuccess) {
      current_ = device;
    } else {
      (void)cudaGetLastError();
    }
    return err;
  }

 private:
  int previous_ = -1;
  int current_ = -1;
};

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cannot query CUDA device ", device, ": ", CudaText(err)));
  }
  return std::string(reinterpret_cast<const char*>(prop.uuid.bytes), kUuidBytes);
}

std::string UuidText(const std::string& uuid) { return absl::BytesToHexString(uuid); }

// The allocation `p` lies in, as the driver knows it (cuMemGetAddressRange, reached
// through the runtime so that nothing links libcuda directly): the extent a mapping really
// has, whatever its descriptor claimed.
absl::Status AllocationRange(void* p, CUdeviceptr* base, size_t* bytes) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetAddressRange fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<GetAddressRange>(f);
  }();
  if (fn == nullptr) return absl::FailedPreconditionError("the CUDA driver offers no cuMemGetAddressRange");
  if (const CUresult r = fn(base, bytes, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat("cuMemGetAddressRange: CUresult ", static_cast<int>(r)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HostId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

absl::StatusOr<IpcPoolDescriptor> ExportIpcPool(void* base, size_t bytes, int device) {
  if (base == nullptr || bytes == 0 || device < 0) {
    return absl::InvalidArgumentError("ExportIpcPool needs an allocation (non-null base, bytes > 0) and a device");
  }
  ScopedDevice scoped;
  if (const cudaError_t err = scoped.Set(device); err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cannot use CUDA device ", device, ": ", CudaText(err)));
  }
  cudaPointerAttributes attr;
  if (const cudaError_t err = cudaPointerGetAttributes(&attr, base); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("not a CUDA pointer: ", CudaText(err)));
  }
  if (attr.type != cudaMemoryTypeDevice || attr.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pool to export is not device memory of device ", device, " (memory type ",
                     static_cast<int>(attr.type), ", device ", attr.device, ")"));
  }
  cudaIpcMemHandle_t handle;
  if (const cudaError_t err = cudaIpcGetMemHandle(&handle, base); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cudaIpcGetMemHandle: ", CudaText(err)));
  }
  absl::StatusOr<std::string> uuid = DeviceUuid(device);
  if (!uuid.ok()) return uuid.status();
  IpcPoolDescriptor d;
  d.host_id = HostId();
  d.device_uuid = *std::move(uuid);
  d.handle.assign(reinterpret_cast<const char*>(&handle), kHandleBytes);
  d.bytes = bytes;
  d.pid = static_cast<int32_t>(getpid());
  return d;
}

IpcMapping::~IpcMapping() {
  if (base_ == nullptr) return;
  ScopedDevice scoped;
  if (scoped.Set(device_) == cudaSuccess && cudaIpcCloseMemHandle(base_) != cudaSuccess) {
    (void)cudaGetLastError();  // the driver may already be shutting down (process exit)
  }
}

absl::StatusOr<std::unique_ptr<IpcMapping>> OpenIpcPool(const IpcPoolDescriptor& d, int device) {
  if (d.handle.size() != kHandleBytes || d.device_uuid.size() != kUuidBytes || d.bytes == 0 || device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("malformed IPC pool descriptor: handle of ", d.handle.size(),
                                                   " bytes (want ", kHandleBytes, "), GPU uuid of ",
                                                   d.device_uuid.size(), " bytes (want ", kUuidBytes, "), ",
                                                   d.bytes, " bytes; local device ", device));
  }
  const std::string host = HostId();
  if (d.host_id != host) {
    return absl::FailedPreconditionError(absl::StrCat("the KV pool of process ", d.pid, " is on another machine (boot id '",
                                                      d.host_id, "', here '", host, "')"));
  }
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no usable CUDA device: ", CudaText(err)));
  }
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("local CUDA device ", device, " does not exist (", count, " visible)"));
  }
  int peer = -1;
  for (int i = 0; i < count && peer < 0; ++i) {
    absl::StatusOr<std::string> uuid = DeviceUuid(i);
    if (!uuid.ok()) return uuid.status();
    if (*uuid == d.device_uuid) peer = i;
  }
  if (peer < 0) {
    return absl::FailedPreconditionError(absl::StrCat("the GPU holding the KV pool of process ", d.pid, " (uuid ",
                                                      UuidText(d.device_uuid),
                                                      ") is not visible to this process (CUDA_VISIBLE_DEVICES?)"));
  }
  if (peer != device) {
    int can = 0;
    if (const cudaError_t err = cudaDeviceCanAccessPeer(&can, device, peer); err != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat("cudaDeviceCanAccessPeer(", device, ", ", peer, "): ", CudaText(err)));
    }
    if (!can) {
      return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device, " has no peer access to device ", peer,
                                                        " holding the KV pool of process ", d.pid));
    }
  }
  ScopedDevice scoped;
  if (const cudaError_t err = scoped.Set(device); err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cannot use CUDA device ", device, ": ", CudaText(err)));
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, d.handle.data(), kHandleBytes);
  void* base = nullptr;
  if (const cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cannot map the KV pool of process ", d.pid, " (device ", peer,
                                                      ") on device ", device, ": cudaIpcOpenMemHandle: ", CudaText(err)));
  }
  std::unique_ptr<IpcMapping> m(new IpcMapping());
  m->base_ = base;  // unmapped by ~IpcMapping on every path below
  m->device_ = device;
  // The extent comes from the mapping itself: a descriptor claiming more than the
  // exporter's allocation would otherwise let writes run past it.
  CUdeviceptr range_base = 0;
  size_t range_bytes = 0;
  if (absl::Status st = AllocationRange(base, &range_base, &range_bytes); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot size the mapped KV pool of process ", d.pid, ": ", st.message()));
  }
  if (range_base != reinterpret_cast<CUdeviceptr>(base) || d.bytes > range_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("IPC pool descriptor of process ", d.pid, " claims ", d.bytes,
                                                   " bytes; the mapped allocation holds ", range_bytes,
                                                   range_base != reinterpret_cast<CUdeviceptr>(base)
                                                       ? " and does not start at the mapping"
                                                       : ""));
  }
  m->bytes_ = range_bytes;
  m->same_device_ = peer == device;
  return m;
}

}  // namespace tandem::cuda_model
