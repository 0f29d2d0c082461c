// What the engine and the router need of a DeepSeek-V4 checkpoint (engine/model/model_info.h),
// shared by the CPU and GPU backends.
#pragma once

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/model_info.h"

namespace tandem::v4 {

ModelInfo V4ModelInfo(const DeepseekV4Config& c);

}  // namespace tandem::v4
