#include "services/prefill/kv_writer_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

v1::LeaseRef LeaseOf(const v1::KvDestination& d) {
  v1::LeaseRef l;
  l.set_lease_id(d.lease_id());
  l.set_lease_token(d.lease_token());
  return l;
}

}  // namespace

KvWriterSession::KvWriterSession(KvWriterRegistry* registry, std::shared_ptr<KvWriteNotices> notices,
                                 const v1::KvDestination& destination, KvWriterIdentity writer)
    : registry_(registry),
      notices_(std::move(notices)),
      decode_address_(destination.decode_address()),
      lease_(LeaseOf(destination)),
      writer_(std::move(writer)) {}

KvWriterSession::~KvWriterSession() { End(); }

void KvWriterSession::Begin(std::chrono::steady_clock::time_point deadline) {
  if (begun_) return;
  begun_ = true;
  // Held here before the decode replica can know of it: its WriterState question cannot
  // come before its record, so it never hears "not writing" from a writer about to write.
  registry_->Add(lease_.lease_id(), lease_.lease_token());
  if (decode_address_.empty() || writer_.address.empty() || writer_.incarnation == 0) {
    gate_->Resolve(absl::AbortedError("the destination names no decode replica to announce writes to, or this "
                                      "replica does not know its own address: no KV is written"));
    return;
  }
  v1::BeginWritesRequest r;
  *r.mutable_lease() = lease_;
  r.set_writer_address(writer_.address);
  r.set_writer_incarnation(writer_.incarnation);
  // A decode replica that does not answer in a few seconds (stopped, overloaded) gets no KV
  // from this call: it ends ABORTED and the router starts over elsewhere.
  const auto answer_by = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  notices_->BeginWrites(decode_address_, r, answer_by, [gate = gate_, id = lease_.lease_id()](absl::Status s) {
    if (s.ok()) {
      gate->Resolve(absl::OkStatus());
    } else {
      gate->Resolve(absl::AbortedError(
          absl::StrCat("the decode replica did not accept writes into lease '", id, "': ", s.ToString())));
    }
  });
}

void KvWriterSession::End() {
  if (!begun_ || ended_) return;
  ended_ = true;
  registry_->Remove(lease_.lease_id(), lease_.lease_token());
  if (decode_address_.empty() || writer_.incarnation == 0) return;
  v1::EndWritesRequest r;
  *r.mutable_lease() = lease_;
  r.set_writer_incarnation(writer_.incarnation);
  // After BeginWrites was answered, so that the end never overtakes the beginning; with
  // the answer in already (the usual case) it goes now, before the Prefill call answers.
  // (A refused BeginWrites recorded nothing; an end for it is ignored.)
  gate_->OnResolved([notices = notices_, address = decode_address_, r](const absl::Status&) {
    notices->EndWrites(address, r);
  });
}

}  // namespace tandem
