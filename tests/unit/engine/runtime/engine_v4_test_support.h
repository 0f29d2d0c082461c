// Shared by the DeepSeek-V4 engine tests: the generated tiny-v4 model, deterministic
// prompts, a request run with every token's logprob and top 5 (for bitwise comparisons of
// a prefix reused against a full prefill), and a sink that stages a prefill's
// whole-sequence KV and writes it into a decode engine's reservation.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem::testing {

inline const std::string& V4Dir() {
  static TempDir* tmp = new TempDir();
  static const std::string dir = v4::testing::MakeV4Model(*tmp, "tiny-v4", v4::testing::TinyV4Json(512).dump());
  return dir;
}

inline std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + salt * 7919 + (i * i) % 17) % 500;
  return t;
}

// The model alone: the prompt in one pass, then one token at a time, argmax each.
inline std::vector<int32_t> ModelGreedy(v4::DeepseekV4Model& m, const std::vector<int32_t>& prompt, int n) {
  v4::SequenceState state = m.NewSequence();
  absl::StatusOr<std::vector<float>> logits = m.Forward(prompt, state, /*all_logits=*/false);
  std::vector<int32_t> out;
  while (logits.ok() && static_cast<int>(out.size()) < n) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(t);
    logits = m.Forward({&t, 1}, state, false);
  }
  EXPECT_TRUE(logits.ok()) << logits.status();
  return out;
}

// Submits every prompt to `e` at once and checks each greedy output against the model alone.
inline void ExpectGreedyOutputs(Engine& e, v4::DeepseekV4Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                int max_tokens) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(GreedyRequest("r" + std::to_string(i), prompts[i], max_tokens));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Result r = Drain(*streams[i]);
    ASSERT_TRUE(r.final.status.ok()) << r.final.status;
    EXPECT_EQ(r.tokens, ModelGreedy(m, prompts[i], max_tokens)) << "prompt " << i << " (" << prompts[i].size()
                                                                << " tokens)";
  }
}

// A request's tokens and every token's logprob and top 5, as its stream gave them.
struct Scored {
  std::vector<int32_t> tokens;
  std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> logprobs;
  RequestMetrics metrics;
};

inline Scored RunScored(Engine& e, EngineRequest r) {
  r.sampling.logprobs = 5;
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  Scored out;
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  RequestOutput o;
  while ((*s)->Next(&o)) {
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    for (const TokenLogprobs& l : o.logprobs) out.logprobs.push_back({l.logprob, l.top});
    if (o.finished) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      out.metrics = o.metrics;
    }
  }
  return out;
}

inline Scored RunScored(Engine& e, const std::string& id, const std::vector<int32_t>& prompt, int max_tokens) {
  return RunScored(e, GreedyRequest(id, prompt, max_tokens));
}

// What a transfer does, in one process: the prefill engine's whole-sequence KV (every
// stream's extents) staged, then copied into the extents of the decode engine's reservation.
class StagingSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice&) override { ADD_FAILURE() << "a V4 sequence's KV is handed over whole"; }
  bool takes_sequence_kv() const override { return true; }
  void OnSequenceKv(const KvSequenceKv& kv) override {
    ++calls;
    num_tokens = kv.num_tokens;
    absl::StatusOr<std::vector<KvExtent>> ex = kv.pool->SequenceExtents(kv.block_table, kv.state_slot, kv.num_tokens);
    ASSERT_TRUE(ex.ok()) << ex.status();
    for (const KvExtent& e : *ex) {
      const std::byte* b = kv.pool->memory().data() + e.offset;
      staged.emplace_back(b, b + e.bytes);
    }
  }
  // Into `d`'s reservation (blocks, slot) for the staged tokens.
  void WriteInto(Engine& d, const KvLeases::Reservation& r) const {
    const Engine::KvMemory m = d.kv_memory();
    const KvPool::Geometry g{.num_layers = static_cast<int32_t>(m.num_layers),
                             .block_size = static_cast<int32_t>(m.block_size), .num_blocks = m.num_blocks,
                             .num_sequence_slots = m.num_state_slots};
    absl::StatusOr<std::vector<KvExtent>> ex =
        KvPool::SequenceExtents(d.kv_layout().streams, g, r.blocks, r.state_slot, num_tokens);
    ASSERT_TRUE(ex.ok()) << ex.status();
    ASSERT_EQ(ex->size(), staged.size());
    for (size_t i = 0; i < staged.size(); ++i) {
      ASSERT_EQ((*ex)[i].bytes, staged[i].size()) << "extent " << i;
      std::memcpy(reinterpret_cast<std::byte*>(m.base) + (*ex)[i].offset, staged[i].data(), staged[i].size());
    }
  }
  int calls = 0;
  int64_t num_tokens = 0;
  std::vector<std::vector<std::byte>> staged;
};

}  // namespace tandem::testing
