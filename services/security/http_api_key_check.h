// The API key check of admin HTTP pages that reveal replicas or requests (the router's
// /replicas and /api/summary): with keys configured they need `authorization: Bearer
// KEY` (401 with WWW-Authenticate otherwise). /metrics, /healthz and /readyz stay open.
// Reading a page takes nothing from a key's request rate.
#pragma once

#include "services/common/admin_server.h"
#include "services/security/api_key_authenticator.h"

namespace tandem::security {

// `handler` behind the key check; `keys` null returns `handler` as is. `keys` must
// outlive the server.
service::AdminServer::Handler RequireApiKey(const ApiKeyAuthenticator* keys, service::AdminServer::Handler handler);

}  // namespace tandem::security
