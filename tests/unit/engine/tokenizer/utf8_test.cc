#include "engine/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::tokenizer_internal {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(Utf8Test, ValidTextIsUnchanged) {
  for (std::string s : {"", "abc", "\xC3\xA9", "\xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x98\x80",
                        "\xEF\xBF\xBF", "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(Utf8Lossy(s), s);
  }
  EXPECT_EQ(Utf8Lossy(std::string("a\0b", 3)), std::string("a\0b", 3));
}

// Expected values are what Rust's String::from_utf8_lossy gives (maximal subparts).
TEST(Utf8Test, LossyReplacesMaximalInvalidSubsequences) {
  struct Case {
    std::string in;
    std::string out;
  };
  const Case cases[] = {
      {"\x80", kFffd},
      {"\xBF\xBF", Repeat(kFffd, 2)},  // lone continuations: one each
      {"\xC0\x80", Repeat(kFffd, 2)},  // C0/C1 never start a sequence
      {"\xC1\xBF", Repeat(kFffd, 2)},
      {"\xC2", kFffd},  // truncated at the end
      {"\xC2"
       "A",
       kFffd + "A"},
      {"\xE2\x82", kFffd},  // truncated 3-byte: one U+FFFD
      {"\xE2\x82"
       "A",
       kFffd + "A"},
      {"\xE2\x82\xE2\x82\xAC", kFffd + "\xE2\x82\xAC"},
      {"\xE0\x80\x80", Repeat(kFffd, 3)},  // overlong: E0 needs A0..BF next
      {"\xE0\x9F\xBF", Repeat(kFffd, 3)},
      {"\xE0\xA0", kFffd},
      {"\xED\xA0\x80", Repeat(kFffd, 3)},  // surrogate
      {"\xED\x9F", kFffd},
      {"\xF0\x8F\xBF\xBF", Repeat(kFffd, 4)},  // overlong 4-byte
      {"\xF0\x9F\x98", kFffd},                 // truncated emoji
      {"\xF0\x9F\x98"
       "x",
       kFffd + "x"},
      {"\xF0\x9F"
       "\xF0\x9F\x98\x80",
       kFffd + "\xF0\x9F\x98\x80"},
      {"\xF4\x90\x80\x80", Repeat(kFffd, 4)},  // above U+10FFFF
      {"\xF5\x80", Repeat(kFffd, 2)},
      {"\xFE\xFF", Repeat(kFffd, 2)},
      {"a\xF1\x80\x80z", "a" + kFffd + "z"},
      {"\xE4\xB8\xAD\xE4\xB8", "\xE4\xB8\xAD" + kFffd},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(IsValidUtf8(c.in));
    EXPECT_EQ(Utf8Lossy(c.in), c.out) << "input bytes: " << c.in.size();
  }
}

TEST(Utf8Test, LossyPrefixHoldsBackOnlyAPossibleCharacter) {
  std::string out;
  EXPECT_EQ(Utf8LossyPrefix("ab\xE4\xB8", &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(Utf8LossyPrefix("\xE4\xB8\xAD", &out), 3u);
  EXPECT_EQ(out, "\xE4\xB8\xAD");
  out.clear();
  // Proven invalid by the byte after: decided at once.
  EXPECT_EQ(Utf8LossyPrefix("\xE4\xB8"
                            "A\xF0\x9F",
                            &out),
            3u);
  EXPECT_EQ(out, kFffd + "A");
  out.clear();
  EXPECT_EQ(Utf8LossyPrefix("\xE0\x80", &out), 2u);  // E0 80 can never complete
  EXPECT_EQ(out, Repeat(kFffd, 2));
}

TEST(Utf8Test, StreamingEqualsWholeForEverySplit) {
  const std::string inputs[] = {
      "h\xC3\xA9llo \xE4\xB8\xAD\xF0\x9F\x98\x80!",
      "\xE2\x82\xE2\x82\xAC\xF0\x9F\x98",
      "\xED\xA0\x80\xF4\x90\x80\x80\xC2",
      "\xF0\x9F\x98\x80\x80\xBF\xE0\xA0\x80\xE0",
  };
  for (const std::string& input : inputs) {
    for (size_t a = 0; a <= input.size(); ++a) {
      for (size_t b = a; b <= input.size(); ++b) {
        std::string out, pending;
        for (std::string chunk : {input.substr(0, a), input.substr(a, b - a), input.substr(b)}) {
          pending += chunk;
          pending.erase(0, Utf8LossyPrefix(pending, &out));
        }
        out += Utf8Lossy(pending);
        EXPECT_EQ(out, Utf8Lossy(input)) << a << " " << b;
      }
    }
  }
}

TEST(Utf8Test, DecodeAndWhitespace) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  size_t pos = 0;
  EXPECT_EQ(DecodeUtf8(s, &pos), 0x61u);
  EXPECT_EQ(DecodeUtf8(s, &pos), 0xE9u);
  EXPECT_EQ(DecodeUtf8(s, &pos), 0x4E2Du);
  EXPECT_EQ(DecodeUtf8(s, &pos), 0x1F600u);
  EXPECT_EQ(pos, s.size());
  size_t start = 0;
  EXPECT_EQ(DecodeUtf8Before(s, s.size(), &start), 0x1F600u);
  EXPECT_EQ(start, 6u);
  std::string encoded;
  for (uint32_t cp : {0x24u, 0xA2u, 0x20ACu, 0x10348u}) AppendUtf8(cp, &encoded);
  EXPECT_EQ(encoded, "$\xC2\xA2\xE2\x82\xAC\xF0\x90\x8D\x88");
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0x85u, 0xA0u, 0x2009u, 0x3000u, 0x2028u}) {
    EXPECT_TRUE(IsUnicodeWhiteSpace(cp)) << cp;
  }
  for (uint32_t cp : {0x41u, 0x200Bu, 0x180Eu, 0xFEFFu}) {
    EXPECT_FALSE(IsUnicodeWhiteSpace(cp)) << cp;
  }
}

}  // namespace
}  // namespace tandem::tokenizer_internal
