#include "services/common/ready_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"

namespace tandem::service {
namespace {

namespace fs = std::filesystem;

class ReadyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_ready_file_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Slurp(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  fs::path dir_;
};

TEST_F(ReadyFileTest, WritesJsonAndLeavesNoTemporaryFile) {
  const fs::path path = dir_ / "ready.json";
  nlohmann::json ready = {{"role", "decode"}, {"pid", 42}, {"grpc", "127.0.0.1:5000"},
                          {"admin", "127.0.0.1:5001"}};
  ASSERT_TRUE(WriteReadyFile(path.string(), ready).ok());
  EXPECT_EQ(nlohmann::json::parse(Slurp(path)), ready);
  // Rewriting replaces it.
  ready["pid"] = 43;
  ASSERT_TRUE(WriteReadyFile(path.string(), ready).ok());
  EXPECT_EQ(nlohmann::json::parse(Slurp(path))["pid"], 43);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "ready.json");
  }
  EXPECT_EQ(files, 1);
}

TEST_F(ReadyFileTest, ReportsErrors) {
  absl::Status status = WriteReadyFile((dir_ / "missing" / "ready.json").string(), {{"a", 1}});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find("missing"), std::string::npos) << status;
  EXPECT_EQ(WriteReadyFile("", {{"a", 1}}).code(), absl::StatusCode::kInvalidArgument);
}

// A poller never sees a partial file while a writer keeps replacing a large one.
TEST_F(ReadyFileTest, ReaderNeverSeesAPartialFile) {
  const fs::path path = dir_ / "ready.json";
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::atomic<int> bad_reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      std::ifstream in(path);
      if (!in) continue;  // not there yet
      std::stringstream ss;
      ss << in.rdbuf();
      auto parsed = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || parsed["items"].size() != 2000) {
        bad_reads.fetch_add(1);
      }
      reads.fetch_add(1);
    }
  });
  for (int round = 0; round < 100; ++round) {
    nlohmann::json ready;
    ready["round"] = round;
    for (int i = 0; i < 2000; ++i) ready["items"].push_back("item-" + std::to_string(i * round));
    ASSERT_TRUE(WriteReadyFile(path.string(), ready).ok());
  }
  // Let the reader see the last version a few times too.
  const int seen = reads.load();
  while (reads.load() < seen + 5) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 5);
  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(nlohmann::json::parse(Slurp(path))["round"], 99);
}

}  // namespace
}  // namespace tandem::service
