// The cluster token on the wire (cluster_token.h): the server-side check, run by gRPC's
// auth metadata processor before any handler sees the call, and the client side, an
// interceptor that adds the token to every call's metadata.
//
// Why these mechanisms (gRPC 1.51): CallCredentials are never sent over an insecure
// channel, so the client adds the metadata itself; and a C++ server interceptor cannot
// end a call with a status, while an auth metadata processor can. The C++ insecure
// ServerCredentials refuse a processor (an assertion), so token-only servers use
// credentials of their own over gRPC's C insecure credentials, which run it.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem::security {

// Plaintext server credentials that refuse, with UNAUTHENTICATED, every call whose
// kClusterTokenMetadataKey metadata is not `token`.
std::shared_ptr<grpc::ServerCredentials> TokenCheckingInsecureServerCredentials(std::string token);

// Installs the same check on TLS server credentials (mutual TLS and a token together).
void AddTokenCheck(grpc::ServerCredentials& tls_credentials, std::string token);

// The interceptor factories that make a channel send `token` with every call (for
// grpc::experimental::CreateCustomChannelWithInterceptors).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> TokenInterceptors(
    std::string token);

// The same for any metadata: `key: value` on every call (clients' API keys,
// "authorization: Bearer KEY").
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MetadataInterceptor(std::string key,
                                                                                          std::string value);

}  // namespace tandem::security
