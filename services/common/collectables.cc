#include "services/common/collectables.h"

#include "prometheus/metric_family.h"

namespace tandem {
namespace {

class Combined : public prometheus::Collectable {
 public:
  explicit Combined(std::vector<std::shared_ptr<prometheus::Collectable>> parts) : parts_(std::move(parts)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    for (const auto& p : parts_) {
      for (auto& f : p->Collect()) out.push_back(std::move(f));
    }
    return out;
  }

 private:
  std::vector<std::shared_ptr<prometheus::Collectable>> parts_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> CombineCollectables(
    std::vector<std::shared_ptr<prometheus::Collectable>> parts) {
  return std::make_shared<Combined>(std::move(parts));
}

}  // namespace tandem
