#include "services/security/http_api_key_check.h"

namespace tandem::security {

service::AdminServer::Handler RequireApiKey(const ApiKeyAuthenticator* keys, service::AdminServer::Handler handler) {
  if (keys == nullptr) return handler;
  return [keys, handler = std::move(handler)](const service::HttpRequest& request) {
    const ApiKeyDecision d = keys->Authenticate(request.Header("authorization"));
    if (d.status.ok()) return handler(request);
    service::HttpResponse r = service::HttpResponse::Json(
        R"({"error": "this page needs an API key: send 'Authorization: Bearer KEY'"})", 401);
    r.headers.push_back({"WWW-Authenticate", "Bearer"});
    return r;
  };
}

}  // namespace tandem::security
