// The byte-level alphabet of GPT-2 style tokenizers: every byte is shown as one printable
// character (bytes_to_unicode), so that a BPE over characters is a BPE over bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

// The UTF-8 encoding of the character that stands for byte `b`.
std::string_view ByteLevelChar(uint8_t b);

// The byte that character `cp` stands for, or -1 if `cp` is not in the alphabet.
int ByteLevelByte(uint32_t cp);

// Each byte of `bytes` replaced by its character.
std::string BytesToByteLevel(std::string_view bytes);

// One token as Hugging Face's ByteLevel decoder turns it into bytes: each character
// mapped back to its byte; if some character is not in the alphabet, the token's own
// UTF-8 bytes instead. `token` must be valid UTF-8.
std::string ByteLevelTokenToBytes(std::string_view token);

}  // namespace tandem::tokenizer_internal
