#include "engine/tokenizer/byte_level.h"

#include <array>

#include "engine/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

struct Alphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte{};  // every alphabet character is below U+0200

  Alphabet() {
    cp_to_byte.fill(-1);
    // Printable bytes keep their own code point; the others take U+0100, U+0101, ...
    // in byte order, as GPT-2's bytes_to_unicode does.
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? b : next++;
      AppendUtf8(byte_to_cp[b], &byte_to_utf8[b]);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* alphabet = new Alphabet();
  return *alphabet;
}

}  // namespace

std::string_view ByteLevelChar(uint8_t b) { return GetAlphabet().byte_to_utf8[b]; }

int ByteLevelByte(uint32_t cp) {
  return cp < GetAlphabet().cp_to_byte.size() ? GetAlphabet().cp_to_byte[cp] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Alphabet& alphabet = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += alphabet.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string ByteLevelTokenToBytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = ByteLevelByte(DecodeUtf8(token, &pos));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace tandem::tokenizer_internal
