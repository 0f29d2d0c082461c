// Chat templates Tandem carries itself: DeepSeek-V3's, which the generated built-in
// models (`tiny`, `tandem make-model`) put in their tokenizer_config.json so that chat
// requests to them are formatted by the same template machinery as a real checkpoint's.
#pragma once

#include <string_view>

namespace tandem {

std::string_view DeepseekV3ChatTemplate();

}  // namespace tandem
