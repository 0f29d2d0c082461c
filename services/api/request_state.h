// The states of one generation request's life in the router (request_core.h), and which
// moves between them are legal. Every change of state goes through CheckTransition, which
// aborts on a move the table does not allow: a handler running in the wrong state is a bug
// to catch at once, not a race to debug later.
#pragma once

#include <string_view>

namespace tandem {

enum class RequestState {
  kQueued,          // validated and admitted, not yet routed
  kReserving,       // a Decode.Reserve is in flight (a KV lease on a decode replica)
  kWaitingForRoom,  // decode replicas full (or failed): a Reserve waits in a replica's queue,
                    // or a pause before the next attempt
  kPrefilling,      // a Prefill is in flight, writing the KV into the held lease
  kDecoding,        // a decode stream (or an aggregated worker's Generate) is open
  kFinishing,       // the client has its outcome; downstream calls are still ending
  kDone,            // nothing is in flight: no event may reach the request any more
};

std::string_view ToString(RequestState s);

// Whether the request may move from `from` to `to`.
bool IsLegalTransition(RequestState from, RequestState to);

// Aborts (TANDEM_CHECK) naming both states when the move is illegal.
void CheckTransition(RequestState from, RequestState to);

// The client has its outcome (kFinishing or kDone).
inline bool IsTerminal(RequestState s) { return s == RequestState::kFinishing || s == RequestState::kDone; }

}  // namespace tandem
