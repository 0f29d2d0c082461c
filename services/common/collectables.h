// Several Prometheus collectables (a registry of instrumented metrics, collectors that
// read state when scraped) served as one, as the admin server's /metrics takes one.
#pragma once

#include <memory>
#include <vector>

#include "prometheus/collectable.h"

namespace tandem {

std::shared_ptr<prometheus::Collectable> CombineCollectables(
    std::vector<std::shared_ptr<prometheus::Collectable>> parts);

}  // namespace tandem
