// Tandem's tokenizer against the real Hugging Face tokenizers library: the fixtures
// (see CMakeLists.txt) ran tests/tools/tokenizer_reference.js on DeepSeek-V3's
// tokenizer.json, on a generated one and on a variant of it using every supported
// pre-tokenizer step and added-token option; this compares every encoding and decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;
using Clock = std::chrono::steady_clock;

struct EncodeCase {
  std::string text;
  Ids ids;
  std::string decoded;  // what HF decodes `ids` to: `text`, unless pre-tokenization altered it
};
struct DecodeCase {
  Ids ids;
  std::string text;
  std::string text_skip_special;
};
struct Reference {
  std::string tokenizer_dir;
  int32_t vocab_size = 0;
  std::vector<EncodeCase> encode;
  std::vector<DecodeCase> decode;
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Printable form of a string for failure messages.
std::string Escaped(const std::string& s) { return Json(s).dump(); }
std::string Show(const Ids& ids) { return Json(ids).dump(); }

class TokenizerReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const char* binary_dir = std::getenv("TANDEM_BINARY_DIR");
    ASSERT_NE(binary_dir, nullptr) << "run through ctest (it sets TANDEM_BINARY_DIR)";
    const std::string path =
        std::string(binary_dir) + "/tests/tokenizer_reference/reference_" + GetParam() + ".json";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path << " is missing: the fixture engine_tokenizer_reference_" << GetParam()
                    << " writes it (it needs node and the npm packages: run "
                    << "scripts/install-deps.sh)";
    std::stringstream contents;
    contents << in.rdbuf();
    const Json json = Json::parse(contents.str());
    reference_.tokenizer_dir = json["tokenizer_dir"];
    reference_.vocab_size = json["vocab_size"];
    for (const Json& entry : json["encode"]) {
      reference_.encode.push_back({entry["text"], entry["ids"].get<Ids>(),
                                   entry.value("decoded", entry["text"].get<std::string>())});
    }
    for (const Json& entry : json["decode"]) {
      reference_.decode.push_back(
          {entry["ids"].get<Ids>(), entry["text"], entry["text_skip_special"]});
    }
    // Loaded once per tokenizer for all the tests.
    static auto* loaded =
        new std::map<std::string, std::pair<std::shared_ptr<Tokenizer>, double>>();
    auto it = loaded->find(GetParam());
    if (it == loaded->end()) {
      const auto start = Clock::now();
      auto tokenizer = Tokenizer::FromDir(reference_.tokenizer_dir);
      const double seconds = Seconds(start);
      ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
      it = loaded
               ->emplace(GetParam(),
                         std::make_pair(std::shared_ptr<Tokenizer>(*std::move(tokenizer)), seconds))
               .first;
    }
    tokenizer_ = it->second.first;
    load_seconds_ = it->second.second;
  }

  // Whether decoding gives back the encoded text (the mixed variant adds prefix spaces and
  // removes NULs).
  bool Lossless() const { return GetParam() != "generated_mixed"; }

  Reference reference_;
  std::shared_ptr<Tokenizer> tokenizer_;
  double load_seconds_ = 0;
};

TEST_P(TokenizerReferenceTest, EncodeMatchesHuggingFace) {
  ASSERT_GE(reference_.encode.size(), 2000u);
  EXPECT_EQ(tokenizer_->vocab_size(), reference_.vocab_size);
  std::vector<Ids> ours;
  ours.reserve(reference_.encode.size());
  const auto start = Clock::now();
  for (const EncodeCase& c : reference_.encode) ours.push_back(tokenizer_->Encode(c.text, false));
  const double encode_seconds = Seconds(start);
  size_t mismatches = 0;
  size_t tokens = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    tokens += ours[i].size();
    if (ours[i] == reference_.encode[i].ids) continue;
    if (++mismatches <= 10) {
      ADD_FAILURE() << "string " << i << ": " << Escaped(reference_.encode[i].text)
                    << "\n  ours: " << Show(ours[i])
                    << "\n  HF:   " << Show(reference_.encode[i].ids);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << ours.size() << " strings";
  std::printf("[ %s ] %zu strings (%zu tokens) identical to HF: %zu; load %.3f s; encode %.3f s\n",
              GetParam().c_str(), ours.size(), tokens, ours.size() - mismatches, load_seconds_,
              encode_seconds);
}

TEST_P(TokenizerReferenceTest, DecodeMatchesHuggingFace) {
  size_t mismatches = 0;
  for (size_t i = 0; i < reference_.decode.size(); ++i) {
    const DecodeCase& c = reference_.decode[i];
    const std::string text = tokenizer_->Decode(c.ids, false);
    const std::string skipped = tokenizer_->Decode(c.ids, true);
    if (text == c.text && skipped == c.text_skip_special) continue;
    if (++mismatches <= 10) {
      ADD_FAILURE() << "ids " << Show(c.ids) << "\n  ours: " << Escaped(text) << " / "
                    << Escaped(skipped) << "\n  HF:   " << Escaped(c.text) << " / "
                    << Escaped(c.text_skip_special);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << reference_.decode.size() << " id sequences";
}

TEST_P(TokenizerReferenceTest, DecodeOfEncodeMatchesHuggingFace) {
  size_t lossless = 0;
  for (const EncodeCase& c : reference_.encode) {
    EXPECT_EQ(tokenizer_->Decode(c.ids, false), c.decoded) << Show(c.ids);
    lossless += c.decoded == c.text;
  }
  // Byte-level BPE without pre-tokenization that alters text gives every string back.
  if (Lossless()) {
    EXPECT_EQ(lossless, reference_.encode.size());
  }
}

TEST_P(TokenizerReferenceTest, BosIsPrependedWithSpecialTokens) {
  // Both tokenizer_config.json files say add_bos_token: true, add_eos_token: false.
  ASSERT_EQ(tokenizer_->bos_id(), 0);
  EXPECT_EQ(tokenizer_->eos_id(), 1);
  for (size_t i = 0; i < reference_.encode.size(); i += 7) {
    const EncodeCase& c = reference_.encode[i];
    Ids expected = {0};
    expected.insert(expected.end(), c.ids.begin(), c.ids.end());
    EXPECT_EQ(tokenizer_->Encode(c.text, true), expected) << Escaped(c.text);
  }
}

// Feeds `ids` one at a time; checks at random points that what came out, plus what
// Finish would give, is Decode of the ids so far, and at the end that all of it is Decode.
void CheckStreaming(const Tokenizer& tokenizer, const Ids& ids, bool skip, std::mt19937* rng) {
  StreamingDetokenizer stream(tokenizer, skip);
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    out += stream.Push(ids[k]);
    if ((*rng)() % 4 == 0) {
      StreamingDetokenizer copy = stream;
      const Ids prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k + 1));
      ASSERT_EQ(out + copy.Finish(), tokenizer.Decode(prefix, skip)) << Show(prefix);
    }
  }
  out += stream.Finish();
  ASSERT_EQ(out, tokenizer.Decode(ids, skip)) << Show(ids);
}

TEST_P(TokenizerReferenceTest, StreamingDetokenizerEqualsDecode) {
  std::mt19937 rng(1234);
  for (const DecodeCase& c : reference_.decode) {
    for (bool skip : {false, true}) CheckStreaming(*tokenizer_, c.ids, skip, &rng);
  }
  for (size_t i = 0; i < reference_.encode.size(); i += 3) {
    Ids ids = reference_.encode[i].ids;
    // Random splits of the text into tokens the stream sees: the ids of random pieces.
    if (ids.size() > 2) {
      const size_t cut = rng() % ids.size();
      std::rotate(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(cut), ids.end());
    }
    CheckStreaming(*tokenizer_, ids, false, &rng);
  }
}

TEST_P(TokenizerReferenceTest, InvalidUtf8IsRepairedBeforeEncoding) {
  std::mt19937 rng(99);
  const char bad[][4] = {"\x80",         "\xFF",         "\xC3",     "\xE4\xB8",
                         "\xF0\x9F\x98", "\xED\xA0\x80", "\xC0\xAF", "\xF8"};
  for (size_t i = 0; i < reference_.encode.size(); i += 5) {
    std::string text = reference_.encode[i].text;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      const size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
      text.insert(at, bad[rng() % std::size(bad)]);
    }
    const std::string repaired = tokenizer_internal::Utf8Lossy(text);
    const Ids ids = tokenizer_->Encode(text, false);
    EXPECT_EQ(ids, tokenizer_->Encode(repaired, false)) << Escaped(repaired);
    if (Lossless()) {
      EXPECT_EQ(tokenizer_->Decode(ids, false), repaired);
    }
  }
}

TEST_P(TokenizerReferenceTest, ConcurrentEncodeAgrees) {
  std::vector<std::thread> threads;
  std::atomic<size_t> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < reference_.encode.size(); i += 2) {
        if (tokenizer_->Encode(reference_.encode[i].text, false) != reference_.encode[i].ids) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0u);
}

TEST_P(TokenizerReferenceTest, LongInputsCostAboutAsMuchAsProse) {
  const std::string inputs[] = {
      std::string(100000, 'a'),
      std::string(100000, ' '),
      std::string(100000, ' ') + "x",
      std::string(100000, '1'),
      std::string(100000, '\n'),
      [] {
        std::string s;
        for (int i = 0; i < 33000; ++i) s += "\xE4\xB8\xAD";  // 中
        return s;
      }(),
      [] {
        std::string s;
        std::mt19937 rng(7);
        for (int i = 0; i < 100000; ++i) s += static_cast<char>('a' + rng() % 26);
        return s;
      }(),
      [] {
        std::string s;
        for (int i = 0; i < 4000; ++i) {
          s += "<\xEF\xBD\x9C"
               "tool\xE2\x96\x81"
               "call";  // partial tokens
        }
        return s;
      }(),
  };
  // Each input against prose of the same length measured in this run (best of two each,
  // so a loaded machine slows both alike): pre-tokenizer regexes that backtrack, or merges
  // that go quadratic on one long word, take hundreds of times longer than prose does.
  const std::string prose = [] {
    std::string s;
    std::mt19937 rng(11);
    while (s.size() < 100000) {
      for (int i = 0, n = 2 + static_cast<int>(rng() % 8); i < n; ++i) s += static_cast<char>('a' + rng() % 26);
      s += (rng() % 12 == 0) ? ". " : " ";
    }
    return s;
  }();
  auto best_seconds = [&](const std::string& input) {
    double best = 1e9;
    for (int rep = 0; rep < 2; ++rep) {
      const auto start = Clock::now();
      const Ids ids = tokenizer_->Encode(input, false);
      best = std::min(best, Seconds(start));
      // (Not EXPECT_EQ: gtest's diff of two 100k-line strings takes minutes.)
      if (rep == 0 && Lossless()) {
        EXPECT_TRUE(tokenizer_->Decode(ids, false) == input) << Escaped(input.substr(0, 20));
      }
    }
    return best;
  };
  const double prose_seconds = best_seconds(prose);
  double slowest = 0;
  for (const std::string& input : inputs) {
    const double seconds = best_seconds(input);
    slowest = std::max(slowest, seconds);
    EXPECT_LT(seconds, 30.0 * prose_seconds + 0.005)
        << Escaped(input.substr(0, 20)) << "... (" << input.size() << " bytes): " << seconds
        << " s; prose of the same length " << prose_seconds << " s";
  }
  std::printf("[ %s ] 100k characters of prose %.4f s; slowest adversarial input %.4f s\n",
              GetParam().c_str(), prose_seconds, slowest);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerReferenceTest,
                         ::testing::Values("deepseek_v3", "generated", "generated_mixed"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
