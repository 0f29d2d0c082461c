#include "services/api/request_state.h"

#include "kernels/common/check.h"

namespace tandem {

std::string_view ToString(RequestState s) {
  switch (s) {
    case RequestState::kQueued: return "queued";
    case RequestState::kReserving: return "reserving";
    case RequestState::kWaitingForRoom: return "waiting-for-room";
    case RequestState::kPrefilling: return "prefilling";
    case RequestState::kDecoding: return "decoding";
    case RequestState::kFinishing: return "finishing";
    case RequestState::kDone: return "done";
  }
  return "?";
}

bool IsLegalTransition(RequestState from, RequestState to) {
  using S = RequestState;
  // Every live state may end (kFinishing); only kFinishing reaches kDone, and kDone is
  // final.
  if (from == S::kDone) return false;
  if (to == S::kFinishing) return from != S::kFinishing;
  if (to == S::kDone) return from == S::kFinishing;
  switch (from) {
    case S::kQueued:
      // Disaggregated: reserve (or wait at once when every decode replica is excluded);
      // aggregated: straight to a worker's stream.
      return to == S::kReserving || to == S::kWaitingForRoom || to == S::kDecoding;
    case S::kReserving:
      // Reserved: prefill. Full or failed: the next replica, or wait.
      return to == S::kReserving || to == S::kWaitingForRoom || to == S::kPrefilling;
    case S::kWaitingForRoom:
      // A Reserve waiting in a replica's queue was granted (prefill), or the pause ended.
      return to == S::kReserving || to == S::kWaitingForRoom || to == S::kPrefilling;
    case S::kPrefilling:
      // Another prefill replica into the same lease, or a fresh lease (transfer failed,
      // prefill replica cut off), or the first token: decode.
      return to == S::kPrefilling || to == S::kReserving || to == S::kWaitingForRoom || to == S::kDecoding;
    case S::kDecoding:
      // Migration: a fresh lease on another replica.
      return to == S::kReserving || to == S::kWaitingForRoom;
    case S::kFinishing:
    case S::kDone:
      return false;
  }
  return false;
}

void CheckTransition(RequestState from, RequestState to) {
  TANDEM_CHECK(IsLegalTransition(from, to)) << "illegal request state transition " << ToString(from) << " -> "
                                            << ToString(to);
}

}  // namespace tandem
