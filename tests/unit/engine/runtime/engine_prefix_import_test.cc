// Prefix KV imported with a request (EngineRequest::prefix_kv, the kvstore tier's entry
// into the engine): outputs identical to computing everything, imported tokens counted as
// cached, the import continuing the local prefix cache, refused or ignored when it does
// not fit, and the exported KV (prefill-only) identical too.
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "engine/runtime/block_hash.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;
using testing::Tokens;

const std::string& ModelDir() { return testing::SmallTinyModelDir(); }

std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) {
  if (o.num_threads == 0) o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(ModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, int max_tokens, std::optional<uint64_t> seed) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = seed ? 0.8f : 0.0f;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

struct Result {
  std::vector<int32_t> tokens;
  RequestOutput final;
};

Result RunToEnd(Engine& e, EngineRequest r) {
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status();
  Result out;
  if (!s.ok()) return out;
  RequestOutput o;
  while ((*s)->Next(&o)) {
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finished) out.final = o;
  }
  return out;
}

// Exported KV: layer -> position -> entry.
class CollectingSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice& s) override {
    for (int64_t p = s.begin; p < s.end; ++p) entries[s.layer][p].assign(s.Entry(p), s.Entry(p) + s.entry_dim);
  }
  std::map<int64_t, std::map<int64_t, std::vector<float>>> entries;
};

// The prompt's full blocks in the kvstore's layout ([block][layer][slot][entry]), from
// an export of a prefill on a cold engine.
struct Blocks {
  std::vector<std::vector<float>> data;
  std::vector<uint64_t> hashes;
};

Blocks ExportBlocks(const std::vector<int32_t>& prompt) {
  auto e = MakeEngine({.enable_prefix_cache = false});
  CollectingSink sink;
  EngineRequest r = Req("export", prompt, 1, std::nullopt);
  r.kv_sink = &sink;
  RunToEnd(*e, std::move(r));
  Blocks b;
  b.hashes = HashFullBlocks(prompt, 64, e->layout_fingerprint());
  for (size_t i = 0; i < b.hashes.size(); ++i) {
    std::vector<float>& block = b.data.emplace_back();
    for (auto& [layer, positions] : sink.entries) {
      for (int64_t p = static_cast<int64_t>(i) * 64; p < static_cast<int64_t>(i + 1) * 64; ++p) {
        block.insert(block.end(), positions.at(p).begin(), positions.at(p).end());
      }
    }
  }
  return b;
}

std::shared_ptr<PrefixKv> Import(const Blocks& b, int32_t first, int32_t n) {
  auto p = std::make_shared<PrefixKv>();
  p->first_block = first;
  for (int32_t i = first; i < first + n; ++i) {
    p->hashes.push_back(b.hashes[i]);
    p->blocks.push_back(b.data[i].data());
  }
  return p;
}

void ExpectNoBlocksInUse(Engine& e) {
  for (int i = 0; i < 500 && e.Stats().kv_blocks_in_use != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(e.Stats().kv_blocks_in_use, 0);
}

TEST(EnginePrefixImportTest, ImportedPrefixGivesIdenticalOutputsAndCountsAsCached) {
  const std::vector<int32_t> prompt = Tokens(300, 5);  // 4 full blocks + 44 tokens
  const Blocks blocks = ExportBlocks(prompt);
  ASSERT_EQ(blocks.hashes.size(), 4u);
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(42)}) {
    auto reference = MakeEngine({.enable_prefix_cache = false});
    const Result expected = RunToEnd(*reference, Req("r", prompt, 24, seed));
    ASSERT_EQ(expected.tokens.size(), 24u);

    // No local prefix cache at all: everything before the last partial block imported.
    auto cold = MakeEngine({.enable_prefix_cache = false});
    EngineRequest r = Req("i", prompt, 24, seed);
    r.prefix_kv = Import(blocks, 0, 4);
    const Result got = RunToEnd(*cold, std::move(r));
    EXPECT_EQ(got.tokens, expected.tokens) << (seed ? "seeded" : "greedy");
    EXPECT_EQ(got.final.metrics.cached_prompt_tokens, 256);
    EXPECT_EQ(got.final.metrics.imported_prompt_tokens, 256);
    EXPECT_EQ(got.final.metrics.computed_prompt_tokens, 44);
    EXPECT_EQ(cold->Stats().prompt_tokens_imported, 256);
    ExpectNoBlocksInUse(*cold);
  }
}

TEST(EnginePrefixImportTest, ImportContinuesTheLocalPrefixCacheAndIsPublished) {
  const std::vector<int32_t> prompt = Tokens(300, 6);
  const Blocks blocks = ExportBlocks(prompt);
  auto reference = MakeEngine({.enable_prefix_cache = false});
  const Result expected = RunToEnd(*reference, Req("r", prompt, 16, 3));

  auto e = MakeEngine();
  // Two blocks cached locally by an earlier request on the same first 130 tokens.
  RunToEnd(*e, Req("warm", std::vector<int32_t>(prompt.begin(), prompt.begin() + 130), 1, 3));
  for (int i = 0; i < 200 && e->CachedPrefixLength(blocks.hashes) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(e->CachedPrefixLength(blocks.hashes), 2);
  EngineRequest r = Req("i", prompt, 16, 3);
  r.prefix_kv = Import(blocks, 2, 2);
  const Result got = RunToEnd(*e, std::move(r));
  EXPECT_EQ(got.tokens, expected.tokens);
  EXPECT_EQ(got.final.metrics.cached_prompt_tokens, 256);
  EXPECT_EQ(got.final.metrics.imported_prompt_tokens, 128);
  // The imported blocks are now in the local prefix cache like computed ones.
  for (int i = 0; i < 200 && e->CachedPrefixLength(blocks.hashes) < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(e->CachedPrefixLength(blocks.hashes), 4);
  const Result again = RunToEnd(*e, Req("again", prompt, 16, 3));
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(again.final.metrics.cached_prompt_tokens, 256);
  EXPECT_EQ(again.final.metrics.imported_prompt_tokens, 0);
  ExpectNoBlocksInUse(*e);
}

TEST(EnginePrefixImportTest, ImportThatDoesNotContinueTheLocalPrefixIsIgnored) {
  const std::vector<int32_t> prompt = Tokens(300, 7);
  const Blocks blocks = ExportBlocks(prompt);
  auto reference = MakeEngine({.enable_prefix_cache = false});
  const Result expected = RunToEnd(*reference, Req("r", prompt, 8, std::nullopt));
  auto e = MakeEngine();
  EngineRequest r = Req("i", prompt, 8, std::nullopt);
  r.prefix_kv = Import(blocks, 2, 2);  // blocks 0 and 1 are nowhere: computed instead
  const Result got = RunToEnd(*e, std::move(r));
  EXPECT_EQ(got.tokens, expected.tokens);
  EXPECT_EQ(got.final.metrics.cached_prompt_tokens, 0);
  EXPECT_EQ(got.final.metrics.computed_prompt_tokens, 300);
  ExpectNoBlocksInUse(*e);
}

TEST(EnginePrefixImportTest, ImportUnderBlockPressureNeverFailsTheRequest) {
  const std::vector<int32_t> prompt = Tokens(300, 8);
  const Blocks blocks = ExportBlocks(prompt);
  auto reference = MakeEngine({.enable_prefix_cache = false});
  const Result expected = RunToEnd(*reference, Req("r", prompt, 4, std::nullopt));
  // 6 blocks: the whole prompt fits, but not while another request holds 4 of them: the
  // import finds no room at first (the request starts computing, is preempted), and is
  // taken once the other request is done.
  auto e = MakeEngine({.num_kv_blocks = 6, .max_batch_tokens = 64});
  auto other = e->Submit(Req("other", Tokens(200, 9), 20, std::nullopt));
  ASSERT_TRUE(other.ok());
  EngineRequest r = Req("i", prompt, 4, std::nullopt);
  r.prefix_kv = Import(blocks, 0, 4);
  const Result got = RunToEnd(*e, std::move(r));
  EXPECT_TRUE(got.final.status.ok()) << got.final.status;
  EXPECT_EQ(got.tokens, expected.tokens);
  RequestOutput o;
  while ((*other)->Next(&o)) {
  }
  ExpectNoBlocksInUse(*e);
}

TEST(EnginePrefixImportTest, ExportOfAnImportedPrefixEqualsTheComputedKv) {
  const std::vector<int32_t> prompt = Tokens(200, 10);  // 3 full blocks + 8
  const Blocks blocks = ExportBlocks(prompt);
  auto computed_engine = MakeEngine({.enable_prefix_cache = false});
  CollectingSink computed;
  EngineRequest a = Req("a", prompt, 1, std::nullopt);
  a.kv_sink = &computed;
  const Result first = RunToEnd(*computed_engine, std::move(a));

  auto e = MakeEngine({.enable_prefix_cache = false});
  CollectingSink imported;
  EngineRequest b = Req("b", prompt, 1, std::nullopt);
  b.kv_sink = &imported;
  b.prefix_kv = Import(blocks, 0, 3);
  const Result second = RunToEnd(*e, std::move(b));
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.final.metrics.imported_prompt_tokens, 192);
  EXPECT_EQ(imported.entries, computed.entries);
}

TEST(EnginePrefixImportTest, MismatchedImportsAreRefused) {
  const std::vector<int32_t> prompt = Tokens(300, 11);
  const Blocks blocks = ExportBlocks(prompt);
  auto e = MakeEngine();
  EngineRequest wrong_prompt = Req("w", Tokens(300, 12), 4, std::nullopt);
  wrong_prompt.prefix_kv = Import(blocks, 0, 2);
  EXPECT_EQ(e->Submit(std::move(wrong_prompt)).status().code(), absl::StatusCode::kInvalidArgument);
  // The prompt's last token must be computed: 256 tokens have 3 usable full blocks.
  EngineRequest too_long = Req("t", std::vector<int32_t>(prompt.begin(), prompt.begin() + 256), 4, std::nullopt);
  too_long.prefix_kv = Import(blocks, 0, 4);
  EXPECT_EQ(e->Submit(std::move(too_long)).status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = Import(blocks, 0, 2);
  missing->blocks.pop_back();
  EngineRequest m = Req("m", prompt, 4, std::nullopt);
  m.prefix_kv = missing;
  EXPECT_EQ(e->Submit(std::move(m)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
