#include "services/common/logging.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "spdlog/logger.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace tandem::service {
namespace {

const char* LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "off";
  }
}

// One JSON object per line: {"ts":..., "level":..., "service":..., "msg":...}.
class JsonLineFormatter : public spdlog::formatter {
 public:
  explicit JsonLineFormatter(std::string service) : service_(std::move(service)) {
    service_json_ = Quote(service_);
  }

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const auto since_epoch = msg.time.time_since_epoch();
    const time_t seconds = static_cast<time_t>(
        std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count());
    const int millis = static_cast<int>(duration_cast<milliseconds>(since_epoch).count() % 1000);
    struct tm tm;
    gmtime_r(&seconds, &tm);
    char ts[40];
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03dZ", millis);

    // "[request ID] text" (RequestLogPrefix) becomes a request_id field.
    std::string payload(msg.payload.data(), msg.payload.size());
    std::string request_field;
    constexpr std::string_view kTag = "[request ";
    if (payload.rfind(kTag, 0) == 0) {
      const size_t close = payload.find("] ", kTag.size());
      if (close != std::string::npos) {
        request_field = absl::StrCat(",\"request_id\":", Quote(payload.substr(kTag.size(), close - kTag.size())));
        payload.erase(0, close + 2);
      }
    }
    std::string line = absl::StrCat("{\"ts\":\"", ts, "\",\"level\":\"", LevelName(msg.level),
                                    "\",\"service\":", service_json_, request_field, ",\"msg\":",
                                    Quote(payload), "}\n");
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLineFormatter>(service_);
  }

 private:
  static std::string Quote(const std::string& s) {
    // Invalid UTF-8 becomes U+FFFD instead of breaking the line.
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  std::string service_;
  std::string service_json_;
};

}  // namespace

const std::vector<std::string>& LogLevelNames() {
  static const std::vector<std::string> names = {"trace", "debug", "info", "warn", "error", "off"};
  return names;
}

const std::vector<std::string>& LogFormatNames() {
  static const std::vector<std::string> names = {"text", "json"};
  return names;
}

absl::Status InitLogging(const std::string& level, const std::string& format,
                         const std::string& service_name) {
  return InitLogging(level, format, service_name,
                     std::make_shared<spdlog::sinks::stderr_sink_mt>());
}

absl::Status InitLogging(const std::string& level, const std::string& format,
                         const std::string& service_name,
                         std::shared_ptr<spdlog::sinks::sink> sink) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  auto it = std::find_if(std::begin(kLevels), std::end(kLevels),
                         [&](const auto& entry) { return level == entry.first; });
  if (it == std::end(kLevels)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown log level '", level, "' (expected one of: ",
                                                   absl::StrJoin(LogLevelNames(), ", "), ")"));
  }
  std::unique_ptr<spdlog::formatter> formatter;
  if (format == "text") {
    // The service name is literal text inside the pattern: escape '%'.
    formatter = std::make_unique<spdlog::pattern_formatter>(
        absl::StrCat("%Y-%m-%d %H:%M:%S.%e %L ", absl::StrReplaceAll(service_name, {{"%", "%%"}}),
                     "] %v"));
  } else if (format == "json") {
    formatter = std::make_unique<JsonLineFormatter>(service_name);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown log format '", format, "' (expected one of: ",
                                                   absl::StrJoin(LogFormatNames(), ", "), ")"));
  }
  if (sink == nullptr) return absl::InvalidArgumentError("InitLogging: null sink");
  sink->set_formatter(std::move(formatter));
  sink->set_level(spdlog::level::trace);
  auto logger = std::make_shared<spdlog::logger>(service_name, std::move(sink));
  logger->set_level(it->second);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace tandem::service
