// DeepSeek-V4 prefixes moved between engines, as the kvstore tier moves them: a prefill
// engine hands over a prompt's block images and the state snapshot where its last full
// block ends (KvSequenceKv::snapshot_slot); another engine given them with a request
// (EngineRequest::prefix_kv with its state) continues with every logprob bitwise that of
// a full prefill, and keeps the state as its own snapshot; blocks cached without their
// state become usable with a state alone; a state of the wrong size or another prompt's
// is refused, naming what.
#include <cstring>
#include <memory>

#include "engine/runtime/block_hash.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/engine_v4_test_support.h"

namespace tandem {
namespace {

using testing::GreedyRequest;
using testing::Prompt;
using testing::RunScored;
using testing::Scored;
using testing::V4Dir;

// What OffloadSequenceKvSink collects (services/prefill/prefix_tier.h), in one process:
// the block images of the prompt's blocks before its last full one ends, and the state
// snapshot there.
class TierCaptureSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice&) override { ADD_FAILURE() << "a V4 sequence's KV is handed over whole"; }
  bool takes_sequence_kv() const override { return true; }
  void OnSequenceKv(const KvSequenceKv& kv) override {
    ASSERT_GE(kv.snapshot_slot, 0) << "the engine keeps a snapshot where the last full block ends";
    const int64_t bs = kv.pool->geometry().block_size;
    ASSERT_EQ(kv.snapshot_tokens % bs, 0);
    const size_t block_bytes = static_cast<size_t>(kv.pool->BlockImageBytes());
    for (int64_t b = 0; b < kv.snapshot_tokens / bs; ++b) {
      blocks.emplace_back(block_bytes / sizeof(float));
      const std::span<std::byte> to[] = {std::as_writable_bytes(std::span<float>(blocks.back()))};
      CopyConcatenated(ReadOnly(kv.pool->BlockImage(kv.block_table[static_cast<size_t>(b)])), to);
    }
    state.resize(static_cast<size_t>(kv.pool->StateImageBytes()));
    const std::span<std::byte> to[] = {std::span<std::byte>(state)};
    CopyConcatenated(ReadOnly(kv.pool->StateImage(kv.snapshot_slot)), to);
  }

  // The import of blocks [first_block, captured) and the state, for `prompt`, split into
  // pieces of `piece` bytes as the kvstore client's staging slots split it.
  std::shared_ptr<PrefixKv> Import(const Engine& e, const std::vector<int32_t>& prompt, int32_t first_block,
                                   size_t piece) const {
    auto p = std::make_shared<PrefixKv>();
    const std::vector<uint64_t> chain = HashFullBlocks(prompt, 64, e.layout_fingerprint());
    p->first_block = first_block;
    for (size_t b = static_cast<size_t>(first_block); b < blocks.size(); ++b) {
      p->hashes.push_back(chain[b]);
      p->blocks.push_back(blocks[b].data());
    }
    for (size_t at = 0; at < state.size(); at += piece) {
      p->state.emplace_back(state.data() + at, std::min(piece, state.size() - at));
    }
    p->state_hash = chain[blocks.size() - 1];
    return p;
  }

  std::vector<std::vector<float>> blocks;
  std::vector<std::byte> state;
};

EngineOptions Options() {
  EngineOptions o;
  o.num_threads = 2;
  return o;
}

// Prompt `prompt`'s KV from a prefill engine of its own.
TierCaptureSink Capture(const std::vector<int32_t>& prompt) {
  TierCaptureSink sink;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), Options());
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return sink;
  EngineRequest r = GreedyRequest("prefill", prompt, 1);
  r.kv_sink = &sink;
  const Scored s = RunScored(**e, std::move(r));
  EXPECT_EQ(s.tokens.size(), 1u);
  return sink;
}

TEST(EngineV4PrefixImportTest, AnImportedPrefixAndItsStateGiveTheLogitsOfAFullPrefill) {
  const std::vector<int32_t> first = Prompt(150, 31);
  std::vector<int32_t> second = first;
  for (int32_t t : Prompt(50, 32)) second.push_back(t);

  EngineOptions cold = Options();
  cold.enable_prefix_cache = false;
  absl::StatusOr<std::unique_ptr<Engine>> ref = Engine::Create(V4Dir(), cold);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Scored want_second = RunScored(**ref, "ref2", second, 12);
  const Scored want_first = RunScored(**ref, "ref1", first, 12);

  const TierCaptureSink tier = Capture(first);
  ASSERT_EQ(tier.blocks.size(), 2u) << "150 tokens: the state after block 1 (128 tokens)";

  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), Options());
  ASSERT_TRUE(e.ok()) << e.status();
  EngineRequest r = GreedyRequest("b", second, 12);
  r.prefix_kv = tier.Import(**e, second, 0, /*piece=*/4096);
  const Scored b = RunScored(**e, std::move(r));
  EXPECT_EQ(b.metrics.cached_prompt_tokens, 128);
  EXPECT_EQ(b.metrics.imported_prompt_tokens, 128);
  EXPECT_EQ(b.metrics.computed_prompt_tokens, 200 - 128);
  EXPECT_EQ(b.tokens, want_second.tokens);
  EXPECT_EQ(b.logprobs, want_second.logprobs);
  ASSERT_EQ(b.logprobs.size(), 12u);

  // The imported state stayed as a snapshot: the same prefix again is a local hit.
  const Scored c = RunScored(**e, "c", first, 12);
  EXPECT_EQ(c.metrics.cached_prompt_tokens, 128);
  EXPECT_EQ(c.metrics.imported_prompt_tokens, 0);
  EXPECT_EQ(c.tokens, want_first.tokens);
  EXPECT_EQ(c.logprobs, want_first.logprobs);
  EXPECT_EQ((*e)->Stats().prompt_tokens_imported, 128);
}

TEST(EngineV4PrefixImportTest, BlocksCachedWithoutTheirStateAreReusedWithAnImportedState) {
  const std::vector<int32_t> first = Prompt(150, 33);
  const std::vector<int32_t> other = Prompt(150, 34);
  EngineOptions cold = Options();
  cold.enable_prefix_cache = false;
  absl::StatusOr<std::unique_ptr<Engine>> ref = Engine::Create(V4Dir(), cold);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Scored want = RunScored(**ref, "ref", first, 12);

  // One snapshot slot: `other`'s snapshot pushes out `first`'s, whose blocks stay cached.
  EngineOptions one = Options();
  one.prefix_state_snapshots = 1;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), one);
  ASSERT_TRUE(e.ok()) << e.status();
  RunScored(**e, "a", first, 4);
  RunScored(**e, "b", other, 4);
  const Scored without = RunScored(**e, "c", first, 12);
  EXPECT_EQ(without.metrics.cached_prompt_tokens, 0) << "no snapshot: the cached blocks are of no use";
  RunScored(**e, "d", other, 4);  // `other` holds the slot again

  const TierCaptureSink tier = Capture(first);
  EngineRequest r = GreedyRequest("e", first, 12);
  r.prefix_kv = tier.Import(**e, first, /*first_block=*/2, /*piece=*/1 << 20);  // the state alone
  ASSERT_TRUE(r.prefix_kv->hashes.empty());
  const Scored with = RunScored(**e, std::move(r));
  EXPECT_EQ(with.metrics.cached_prompt_tokens, 128);
  EXPECT_EQ(with.metrics.imported_prompt_tokens, 0) << "every block was here already";
  EXPECT_EQ(with.tokens, want.tokens);
  EXPECT_EQ(with.logprobs, want.logprobs);
}

TEST(EngineV4PrefixImportTest, AStateOfTheWrongSizeOrAnotherPromptIsRefused) {
  const std::vector<int32_t> prompt = Prompt(150, 35);
  const TierCaptureSink tier = Capture(prompt);
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), Options());
  ASSERT_TRUE(e.ok()) << e.status();

  EngineRequest r = GreedyRequest("short", prompt, 4);
  std::shared_ptr<PrefixKv> p = tier.Import(**e, prompt, 0, 1 << 20);
  p->state.back() = p->state.back().first(p->state.back().size() - 4);
  r.prefix_kv = p;
  absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(std::move(r));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("bytes; this layout's is"), std::string::npos) << s.status();

  EngineRequest w = GreedyRequest("wrong", prompt, 4);
  p = tier.Import(**e, prompt, 0, 1 << 20);
  p->state_hash ^= 1;
  w.prefix_kv = p;
  s = (*e)->Submit(std::move(w));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("not this prompt's at block 2"), std::string::npos) << s.status();

  EngineRequest none = GreedyRequest("none", prompt, 4);
  p = tier.Import(**e, prompt, 0, 1 << 20);
  p->state.clear();
  none.prefix_kv = p;
  s = (*e)->Submit(std::move(none));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << "blocks without a state cannot be used";
}

}  // namespace
}  // namespace tandem
