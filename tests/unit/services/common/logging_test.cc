// The log line formats are an interface (log shippers parse the JSON lines), so they
// are tested here; nothing else asserts on log text.
#include "services/common/logging.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace tandem::service {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(LoggingTest, TextFormat) {
  std::ostringstream out;
  ASSERT_TRUE(InitLogging("info", "text", "router", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)).ok());
  spdlog::debug("hidden");
  spdlog::info("listening on {}", "127.0.0.1:9000");
  spdlog::warn("slow");
  spdlog::error("broken");
  auto lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 3u) << out.str();
  const std::regex prefix(R"(^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ([IWE]) router\] (.*)$)");
  std::smatch match;
  ASSERT_TRUE(std::regex_match(lines[0], match, prefix)) << lines[0];
  EXPECT_EQ(match[1], "I");
  EXPECT_EQ(match[2], "listening on 127.0.0.1:9000");
  ASSERT_TRUE(std::regex_match(lines[1], match, prefix)) << lines[1];
  EXPECT_EQ(match[1], "W");
  ASSERT_TRUE(std::regex_match(lines[2], match, prefix)) << lines[2];
  EXPECT_EQ(match[1], "E");
}

TEST(LoggingTest, JsonFormatIsOneObjectPerLine) {
  std::ostringstream out;
  ASSERT_TRUE(InitLogging("debug", "json", "decode-0", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)).ok());
  spdlog::trace("hidden");
  spdlog::debug("quote \" backslash \\ newline \n tab \t done");
  spdlog::warn("bad utf-8: \xff\xfe");
  auto lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["level"], "debug");
  EXPECT_EQ(first["service"], "decode-0");
  EXPECT_EQ(first["msg"], "quote \" backslash \\ newline \n tab \t done");
  EXPECT_TRUE(std::regex_match(first["ts"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << first["ts"];
  auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["level"], "warn");
  EXPECT_EQ(second["msg"].get<std::string>().rfind("bad utf-8: ", 0), 0u);
}

TEST(LoggingTest, InvalidLevelOrFormatIsAnError) {
  absl::Status status = InitLogging("loud", "text", "router");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'loud'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("trace, debug, info, warn, error"), std::string::npos) << status;
  status = InitLogging("info", "xml", "router");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'xml'"), std::string::npos) << status;
  for (const std::string& level : LogLevelNames()) {
    EXPECT_TRUE(InitLogging(level, "text", "router").ok()) << level;
  }
}

}  // namespace
}  // namespace tandem::service
