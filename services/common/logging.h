// Process-wide logging for the services, on spdlog. After InitLogging, log with
// spdlog's free functions (spdlog::info("listening on {}", addr)); they go to the logger
// installed here.
//
//   text: 2026-11-29 17:00:00.123 I router] listening on 127.0.0.1:9000
//   json: {"ts":"2026-11-29T17:00:00.123Z","level":"info","service":"router","msg":"listening on 127.0.0.1:9000"}
//
// Text lines carry local time; JSON lines carry UTC (RFC 3339, milliseconds), one
// object per line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace spdlog::sinks {
class sink;
}  // namespace spdlog::sinks

namespace tandem::service {

// Start a log message with this to tie it to a request: "[request ID] ". Text logs show
// it as is; JSON logs turn it into a "request_id" field, so one request can be followed
// across the router, prefill, decode and kvstore logs (they all use the same id).
inline std::string RequestLogPrefix(const std::string& request_id) { return "[request " + request_id + "] "; }

// The accepted --log-level and --log-format values, for flag validators and help.
const std::vector<std::string>& LogLevelNames();   // trace debug info warn error off
const std::vector<std::string>& LogFormatNames();  // text json

// Installs the default spdlog logger, named `service_name`, writing to stderr in
// `format` at `level` and above. Call once at startup, after flags are parsed; calling
// again replaces the logger. Errors: INVALID_ARGUMENT for an unknown level or format
// (the message lists the accepted ones); nothing is changed then.
absl::Status InitLogging(const std::string& level, const std::string& format,
                         const std::string& service_name);

// The same, writing to `sink` instead of stderr (tests, or a file sink).
absl::Status InitLogging(const std::string& level, const std::string& format,
                         const std::string& service_name,
                         std::shared_ptr<spdlog::sinks::sink> sink);

}  // namespace tandem::service
