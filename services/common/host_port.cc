#include "services/common/host_port.h"

#include <arpa/inet.h>

#include <cctype>

#include "absl/strings/str_cat.h"

namespace tandem::service {
namespace {

absl::Status Invalid(std::string_view address, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid address '", std::string(address), "': ", std::string(why)));
}

bool IsHostNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

}  // namespace

std::string FormatHostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {
    return absl::StrCat("[", std::string(host), "]:", port);
  }
  return absl::StrCat(std::string(host), ":", port);
}

std::string HostPort::ToString() const { return FormatHostPort(host, port); }

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  if (address.empty()) return Invalid(address, "empty; expected HOST:PORT");
  HostPort result;
  std::string_view rest;
  if (address.front() == '[') {
    size_t close = address.find(']');
    if (close == std::string_view::npos) {
      return Invalid(address, "missing ']' after the IPv6 address; expected [V6]:PORT");
    }
    result.host = std::string(address.substr(1, close - 1));
    if (result.host.empty()) return Invalid(address, "empty IPv6 address in brackets");
    in6_addr unused;
    if (inet_pton(AF_INET6, result.host.c_str(), &unused) != 1) {
      return Invalid(address, absl::StrCat("'", result.host, "' is not an IPv6 address"));
    }
    rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') {
      return Invalid(address, "missing ':PORT' after ']'; expected [V6]:PORT");
    }
    rest.remove_prefix(1);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) {
      return Invalid(address, "missing ':PORT'; expected HOST:PORT (port 0 = any free port)");
    }
    std::string_view host = address.substr(0, colon);
    if (host.find(':') != std::string_view::npos) {
      return Invalid(address, "an IPv6 address needs brackets: [V6]:PORT");
    }
    if (host.empty()) return Invalid(address, "empty host; expected HOST:PORT");
    for (char c : host) {
      if (!IsHostNameChar(c)) {
        return Invalid(address, absl::StrCat("character '", std::string(1, c),
                                             "' cannot appear in a host name"));
      }
    }
    result.host = std::string(host);
    rest = address.substr(colon + 1);
  }
  if (rest.empty()) return Invalid(address, "empty port; expected HOST:PORT");
  if (rest.size() > 5) return Invalid(address, "port out of range 0..65535");
  uint32_t port = 0;
  for (char c : rest) {
    if (c < '0' || c > '9') {
      return Invalid(address, absl::StrCat("port '", std::string(rest), "' is not a number"));
    }
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) return Invalid(address, "port out of range 0..65535");
  result.port = static_cast<uint16_t>(port);
  return result;
}

}  // namespace tandem::service
