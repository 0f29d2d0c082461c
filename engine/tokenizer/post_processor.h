// What Encode(text, add_special_tokens=true) puts around the ids of the text: a template
// of special-token ids and the sequence itself ($A), from tokenizer.json's
// TemplateProcessing / BertProcessing / RobertaProcessing, or from tokenizer_config.json's
// add_bos_token / add_eos_token (which override it, as transformers' LlamaTokenizerFast
// does).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::tokenizer_internal {

class SpecialTokenTemplate {
 public:
  struct Item {
    bool is_sequence = false;  // $A
    std::vector<int32_t> ids;  // special token ids, when !is_sequence
  };

  SpecialTokenTemplate() { items_.push_back(Item{true, {}}); }  // just $A
  explicit SpecialTokenTemplate(std::vector<Item> items) : items_(std::move(items)) {}

  // Ids of the whole encoding given the ids of the sequence.
  std::vector<int32_t> Apply(std::vector<int32_t> sequence) const {
    if (items_.size() == 1 && items_[0].is_sequence) return sequence;
    std::vector<int32_t> out;
    out.reserve(sequence.size() + 4);
    for (const Item& item : items_) {
      const std::vector<int32_t>& ids = item.is_sequence ? sequence : item.ids;
      out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
  }

  const std::vector<Item>& items() const { return items_; }

 private:
  std::vector<Item> items_;
};

}  // namespace tandem::tokenizer_internal
