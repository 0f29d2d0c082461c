// One Prefill call's writes into its lease, from the writer's side (docs/architecture.md,
// "KV leases"): Begin registers the lease as held by this process (KvWriterRegistry) and
// announces the writer to the decode replica (Decode.BeginWrites); the gate opens only
// when that is answered OK. End, once every write has completed remotely or none will be
// made, unregisters the lease and sends Decode.EndWrites (once BeginWrites was answered,
// so that it never overtakes it). The destructor ends a session that was begun and not
// ended, so no exit path of the handler leaves it open.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "services/prefill/kv_write_notices.h"
#include "services/prefill/kv_writer_registry.h"
#include "services/prefill/write_gate.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

// Who writes: this process's internal address and incarnation.
struct KvWriterIdentity {
  std::string address;
  uint64_t incarnation = 0;
};

class KvWriterSession {
 public:
  // `registry` must outlive the session.
  KvWriterSession(KvWriterRegistry* registry, std::shared_ptr<KvWriteNotices> notices,
                  const v1::KvDestination& destination, KvWriterIdentity writer);
  ~KvWriterSession();
  KvWriterSession(const KvWriterSession&) = delete;
  KvWriterSession& operator=(const KvWriterSession&) = delete;

  // The gate the sinks check (shared: it outlives the session in their hands).
  const std::shared_ptr<WriteGate>& gate() const { return gate_; }
  // Once. The gate resolves with the decode replica's answer: OK, or ABORTED saying why no
  // write may be made (refused, unreachable, `deadline` passed).
  void Begin(std::chrono::steady_clock::time_point deadline);
  // Once, after the last write completed (or when none will be made); no-op before Begin.
  void End();

 private:
  KvWriterRegistry* registry_;
  std::shared_ptr<KvWriteNotices> notices_;
  const std::string decode_address_;
  const v1::LeaseRef lease_;
  const KvWriterIdentity writer_;
  std::shared_ptr<WriteGate> gate_ = std::make_shared<WriteGate>();
  bool begun_ = false;
  bool ended_ = false;
};

}  // namespace tandem
