// The event-stream parser against the examples of the WHATWG HTML standard's
// server-sent events section (9.2.6, "Interpreting an event stream"), fed whole and
// split at every byte, with each of the three line endings; and base-URL parsing.
#include "cli/bench/sse_parser.h"

#include <string>
#include <vector>

#include "cli/bench/http_client.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

std::vector<std::string> Parse(const std::string& stream, size_t split_at = std::string::npos) {
  SseParser p;
  std::vector<std::string> events;
  auto on_event = [&](const std::string& e) { events.push_back(e); };
  if (split_at >= stream.size()) {
    p.Feed(stream, on_event);
  } else {
    p.Feed(std::string_view(stream).substr(0, split_at), on_event);
    p.Feed(std::string_view(stream).substr(split_at), on_event);
  }
  return events;
}

std::string WithLineEnd(std::string s, const std::string& eol) {
  std::string out;
  for (char c : s) out += c == '\n' ? eol : std::string(1, c);
  return out;
}

// Every split point and line ending gives the same events.
void ExpectEvents(const std::string& lf_stream, const std::vector<std::string>& want) {
  for (const std::string eol : {"\n", "\r\n", "\r"}) {
    const std::string stream = WithLineEnd(lf_stream, eol);
    for (size_t at = 0; at <= stream.size(); ++at) {
      EXPECT_EQ(Parse(stream, at), want) << "line end " << (eol == "\n" ? "LF" : eol == "\r" ? "CR" : "CRLF")
                                         << ", split at " << at;
    }
  }
}

TEST(SseParserTest, MultiLineData) {
  // The standard's stock-quote stream: one event, its three data lines joined.
  ExpectEvents("data: YHOO\ndata: +2\ndata: 10\n\n", {"YHOO\n+2\n10"});
}

TEST(SseParserTest, CommentsAndOtherFieldsAreSkipped) {
  // The standard's four-block stream: a comment alone fires nothing, `id` fields do not
  // touch the data, and only the first space after the colon is dropped.
  ExpectEvents(": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
               {"first event", "second event", " third event"});
}

TEST(SseParserTest, EmptyDataAndAnUnfinishedLastEvent) {
  // The standard's stream of bare `data` lines: an empty event, then one holding a
  // single LF; the last block, never ended by a blank line, fires nothing.
  ExpectEvents("data\n\ndata\ndata\n\ndata:", {"", "\n"});
  SseParser p;
  p.Feed("data:", [](const std::string&) {});
  EXPECT_TRUE(p.pending());
}

TEST(SseParserTest, SpaceAfterTheColonIsOptional) {
  // The standard's pair of identical events, with and without the space.
  ExpectEvents("data:test\n\ndata: test\n\n", {"test", "test"});
}

TEST(SseParserTest, OpenAiStream) {
  ExpectEvents("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n",
               {"{\"choices\":[{\"text\":\"a\"}]}", "{\"choices\":[],\"usage\":{}}", "[DONE]"});
}

TEST(HttpBaseUrlTest, Parses) {
  absl::StatusOr<HttpBaseUrl> u = ParseHttpBaseUrl("http://127.0.0.1:8000/v1/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->path, "/v1");
  u = ParseHttpBaseUrl("http://[::1]:9/v1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9);
  u = ParseHttpBaseUrl("http://localhost");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->path, "");
  EXPECT_EQ(ParseHttpBaseUrl("https://x/v1").status().code(), absl::StatusCode::kUnimplemented);
  for (const char* bad : {"127.0.0.1:8000/v1", "http://", "http://h:0/v1", "http://h:99999", "http://h:x", "http://[::1"}) {
    EXPECT_EQ(ParseHttpBaseUrl(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace tandem::cli
