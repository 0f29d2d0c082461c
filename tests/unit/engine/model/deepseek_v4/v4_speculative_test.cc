// DeepSeek-V4 and speculative decoding (docs/speculative-decoding.md): a state taken back
// over refused drafts is bitwise the state of a pass over the kept tokens alone (its
// window ring, compressor windows, entries and overlap halves, crossing window closes and
// ring wraps), and continues with the same logits; the MTP layer gives the same bits
// however its positions are split; over the paged pool, a verify pass followed by
// AcceptDrafts leaves the pool as a pass over the accepted tokens would, and the draft
// pass's chained runs leave it untouched.
#include <cstring>
#include <map>

#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "engine/model/deepseek_v4/v4_state_undo.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

constexpr int64_t kVocab = 512;

std::vector<int32_t> Tokens(int64_t n, uint32_t seed) { return testing::RandomTokens(n, seed, kVocab); }

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Every field of two compressor states, bit for bit (the unfinished window's rows past
// partial_tokens included: a taken-back state must restore them too).
void ExpectSameCompressor(const CompressorState& a, const CompressorState& b, const std::string& where) {
  EXPECT_EQ(a.num_entries, b.num_entries) << where;
  EXPECT_EQ(a.partial_tokens, b.partial_tokens) << where;
  EXPECT_EQ(a.has_overlap, b.has_overlap) << where;
  EXPECT_TRUE(SameBits(a.entries, b.entries)) << where << ": entries";
  EXPECT_TRUE(SameBits(a.partial_kv, b.partial_kv)) << where << ": partial kv";
  EXPECT_TRUE(SameBits(a.partial_gate, b.partial_gate)) << where << ": partial gate";
  EXPECT_TRUE(SameBits(a.overlap_kv, b.overlap_kv)) << where << ": overlap kv";
  EXPECT_TRUE(SameBits(a.overlap_gate, b.overlap_gate)) << where << ": overlap gate";
}

void ExpectSameState(const SequenceState& a, const SequenceState& b, const std::string& where) {
  ASSERT_EQ(a.num_tokens, b.num_tokens) << where;
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const std::string at = absl::StrCat(where, ", layer ", l);
    EXPECT_TRUE(SameBits(a.layers[l].window, b.layers[l].window)) << at << ": window ring";
    ASSERT_EQ(a.layers[l].compressor.has_value(), b.layers[l].compressor.has_value());
    if (a.layers[l].compressor) ExpectSameCompressor(*a.layers[l].compressor, *b.layers[l].compressor, at);
    ASSERT_EQ(a.layers[l].indexer.has_value(), b.layers[l].indexer.has_value());
    if (a.layers[l].indexer) ExpectSameCompressor(*a.layers[l].indexer, *b.layers[l].indexer, at + " indexer");
  }
}

class V4SpeculativeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    // FP8 with FP4 experts: the official names, which carry the MTP layer.
    dir_ = new std::string(MakeV4Model(*tmp_, "tiny-v4-fp8", TinyV4Json(kVocab).dump(), DType::kF8E4M3));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete tmp_;
  }
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeepseekV4Model>> r = DeepseekV4Model::Load(*dir_, {.num_threads = 2});
    ASSERT_TRUE(r.ok()) << r.status();
    model_ = std::move(*r);
    ASSERT_TRUE(model_->has_mtp());
  }
  // The state after `tokens` in one pass.
  SequenceState After(std::span<const int32_t> tokens) {
    SequenceState s = model_->NewSequence();
    EXPECT_TRUE(model_->Forward(tokens, s, false).ok());
    return s;
  }

  static TempDir* tmp_;
  static std::string* dir_;
  std::unique_ptr<DeepseekV4Model> model_;
};
TempDir* V4SpeculativeTest::tmp_ = nullptr;
std::string* V4SpeculativeTest::dir_ = nullptr;

TEST_F(V4SpeculativeTest, TakenBackStatesAreThoseOfThePassOverTheKeptTokens) {
  const DeepseekV4Config& c = model_->config();
  ASSERT_EQ(c.sliding_window, 16);
  ASSERT_EQ(c.compress_rate_csa, 4);
  // Prompt lengths putting the verified positions across CSA window closes (every 4),
  // an HCA close (every 16) and the ring's wrap; chunks of 1 + 5 drafts and 1 + 2.
  for (const int64_t prompt_len : {13, 14, 30, 31, 45}) {
    for (const int64_t drafts : {2, 5}) {
      const std::vector<int32_t> all = Tokens(prompt_len + 1 + drafts + 3, static_cast<uint32_t>(prompt_len));
      const std::span<const int32_t> prompt = std::span(all).first(static_cast<size_t>(prompt_len));
      const std::span<const int32_t> chunk = std::span(all).subspan(static_cast<size_t>(prompt_len), 1 + drafts);
      SequenceState verified = After(prompt);
      StateUndo undo;
      ASSERT_TRUE(model_->Forward(chunk, verified, true, {.undo = &undo, .undo_from = prompt_len + 1}).ok());
      ASSERT_EQ(undo.from, prompt_len + 1);
      ASSERT_EQ(undo.end, prompt_len + 1 + drafts);
      for (int64_t kept = 0; kept <= drafts; ++kept) {
        const std::string where = absl::StrCat("prompt ", prompt_len, ", ", drafts, " drafts, ", kept, " kept");
        SequenceState back = verified;
        TakeBack(undo, prompt_len + 1 + kept, c.sliding_window, back);
        SequenceState want = After(std::span(all).first(static_cast<size_t>(prompt_len + 1 + kept)));
        ExpectSameState(back, want, where);
        // And both go on alike.
        const std::span<const int32_t> next = std::span(all).subspan(static_cast<size_t>(prompt_len + 1 + kept), 2);
        absl::StatusOr<std::vector<float>> a = model_->Forward(next, back, true);
        absl::StatusOr<std::vector<float>> b = model_->Forward(next, want, true);
        ASSERT_TRUE(a.ok() && b.ok());
        EXPECT_TRUE(SameBits(*a, *b)) << where;
      }
    }
  }
}

TEST_F(V4SpeculativeTest, TheMtpLayerGivesTheSameBitsHoweverItsPositionsAreSplit) {
  const DeepseekV4Config& c = model_->config();
  const int64_t hs = c.hc_mult * c.hidden_size;
  const std::vector<int32_t> tokens = Tokens(41, 9);
  SequenceState s = model_->NewSequence();
  std::vector<float> hidden;
  ASSERT_TRUE(model_->Forward(std::span(tokens).first(40), s, false, {.hidden = &hidden}).ok());
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), 40 * hs);
  // MTP positions 0..39: hidden row p with token p + 1.
  const std::span<const int32_t> next = std::span(tokens).subspan(1, 40);
  LayerState whole = model_->NewMtpState();
  std::vector<float> whole_streams;
  const std::vector<float> whole_logits = model_->RunMtp(hidden.data(), next, 0, whole, &whole_streams);
  ASSERT_EQ(static_cast<int64_t>(whole_logits.size()), c.vocab_size);
  for (const int64_t split : {1, 7, 17, 39}) {
    LayerState parts = model_->NewMtpState();
    std::vector<float> first_streams, second_streams;
    model_->RunMtp(hidden.data(), next.first(static_cast<size_t>(split)), 0, parts, &first_streams, false);
    const std::vector<float> logits =
        model_->RunMtp(&hidden[split * hs], next.subspan(static_cast<size_t>(split)), split, parts, &second_streams);
    EXPECT_TRUE(SameBits(logits, whole_logits)) << "split at " << split;
    first_streams.insert(first_streams.end(), second_streams.begin(), second_streams.end());
    EXPECT_TRUE(SameBits(first_streams, whole_streams)) << "split at " << split;
    EXPECT_TRUE(SameBits(parts.window, whole.window)) << "split at " << split;
  }
  // The draft is not noise: its logits depend on the token and on the hidden streams.
  LayerState other = model_->NewMtpState();
  std::vector<float> streams;
  std::vector<int32_t> changed(next.begin(), next.end());
  changed.back() = (changed.back() + 1) % static_cast<int32_t>(c.vocab_size);
  EXPECT_FALSE(SameBits(model_->RunMtp(hidden.data(), changed, 0, other, &streams), whole_logits));
}

// Over the paged pool, through PagedV4Model: the verify pass, AcceptDrafts and the draft pass.
class PagedV4SpeculativeTest : public V4SpeculativeTest {
 protected:
  void SetUp() override {
    V4SpeculativeTest::SetUp();
    absl::StatusOr<std::unique_ptr<PagedV4Model>> m = PagedV4Model::Load(*dir_, {.num_threads = 2, .mtp = true});
    ASSERT_TRUE(m.ok()) << m.status();
    paged_ = std::move(*m);
    pools_[0] = NewPool();
    pools_[1] = NewPool();
  }
  std::unique_ptr<KvPool> NewPool() {
    absl::StatusOr<std::unique_ptr<KvPool>> p =
        KvPool::Create(paged_->kv_streams(), {.num_layers = static_cast<int32_t>(paged_->config().num_hidden_layers + 1),
                                              .block_size = 64, .num_blocks = 4, .num_sequence_slots = 2});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }
  // Every per-sequence stream's rows of `slot`, and the paged entries of `blocks`.
  static std::vector<std::byte> Image(KvPool& pool, int64_t slot, std::span<const int32_t> blocks) {
    std::vector<std::byte> out;
    for (int s = 0; s < static_cast<int>(pool.streams().size()); ++s) {
      for (int32_t layer : pool.streams()[s].layers) {
        if (pool.streams()[s].granularity == KvGranularity::kSequenceState ||
            pool.streams()[s].granularity == KvGranularity::kRing) {
          std::span<std::byte> rows = pool.SequenceRows(s, layer, slot);
          out.insert(out.end(), rows.begin(), rows.end());
        } else {
          for (int32_t b : blocks) {
            std::span<std::byte> page = pool.Page(s, layer, b);
            out.insert(out.end(), page.begin(), page.end());
          }
        }
      }
    }
    return out;
  }

  std::unique_ptr<PagedV4Model> paged_;
  std::unique_ptr<KvPool> pools_[2];
};

TEST_F(PagedV4SpeculativeTest, AcceptDraftsLeavesThePoolAsAPassOverTheAcceptedTokens) {
  const std::vector<int32_t> blocks = {3, 1};
  const int64_t prompt_len = 62, drafts = 4;
  const std::vector<int32_t> all = Tokens(prompt_len + 1 + drafts + 2, 5);
  const std::span<const int32_t> prompt = std::span(all).first(static_cast<size_t>(prompt_len));
  const std::span<const int32_t> chunk = std::span(all).subspan(static_cast<size_t>(prompt_len), 1 + drafts);
  for (int32_t accepted = 0; accepted <= drafts; ++accepted) {
    // Pool 0: the prompt with its MTP positions, then the verify pass and AcceptDrafts.
    // Pool 1: the prompt, then the accepted tokens alone.
    for (int i = 0; i < 2; ++i) {
      const ForwardSequence p{.tokens = prompt, .block_table = blocks, .state_slot = 1, .mtp = true,
                              .mtp_next_token = all[prompt_len]};
      ASSERT_TRUE(paged_->Forward({&p, 1}, *pools_[i]).ok());
    }
    const ForwardSequence verify{.tokens = chunk, .start_position = prompt_len, .block_table = blocks,
                                 .all_logits = true, .state_slot = 1, .keep_hidden = true,
                                 .num_drafts = static_cast<int32_t>(drafts)};
    absl::StatusOr<std::vector<float>> v = paged_->Forward({&verify, 1}, *pools_[0]);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(paged_->AcceptDrafts(1, accepted, *pools_[0]).ok());
    EXPECT_FALSE(paged_->AcceptDrafts(1, accepted, *pools_[0]).ok()) << "twice";
    const ForwardSequence plain{.tokens = chunk.first(static_cast<size_t>(1 + accepted)),
                                .start_position = prompt_len, .block_table = blocks, .all_logits = true,
                                .state_slot = 1};
    absl::StatusOr<std::vector<float>> w = paged_->Forward({&plain, 1}, *pools_[1]);
    ASSERT_TRUE(w.ok()) << w.status();
    // The verify rows up to the first refused draft are the plain pass's.
    EXPECT_TRUE(SameBits(std::vector<float>(v->begin(), v->begin() + (1 + accepted) * kVocab), *w));
    // The pools agree but for the window rows and entries past the accepted tokens, which
    // only the verify pass wrote and nothing reads: compare what the next pass gives.
    const int64_t at = prompt_len + 1 + accepted;
    const std::span<const int32_t> next = std::span(all).subspan(static_cast<size_t>(at), 1);
    std::vector<float> after[2];
    for (int i = 0; i < 2; ++i) {
      const ForwardSequence n{.tokens = next, .start_position = at, .block_table = blocks, .state_slot = 1};
      absl::StatusOr<std::vector<float>> l = paged_->Forward({&n, 1}, *pools_[i]);
      ASSERT_TRUE(l.ok()) << l.status();
      after[i] = std::move(*l);
    }
    EXPECT_TRUE(SameBits(after[0], after[1])) << accepted << " accepted";
    // The per-sequence streams (rings, compressor windows, last hidden streams) are bitwise
    // equal, the ring rows the refused drafts overwrote restored.
    for (int s = 0; s < static_cast<int>(pools_[0]->streams().size()); ++s) {
      const KvGranularity g = pools_[0]->streams()[s].granularity;
      if (g != KvGranularity::kSequenceState && g != KvGranularity::kRing) continue;
      for (int32_t layer : pools_[0]->streams()[s].layers) {
        std::span<std::byte> a = pools_[0]->SequenceRows(s, layer, 1), b = pools_[1]->SequenceRows(s, layer, 1);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0)
            << pools_[0]->streams()[s].name << " layer " << layer << ", " << accepted << " accepted";
      }
    }
  }
}

TEST_F(PagedV4SpeculativeTest, ChainedDraftsLeaveThePoolAsTheFirstDraftDoes) {
  const std::vector<int32_t> blocks = {0};
  const std::vector<int32_t> prompt = Tokens(20, 11);
  const ForwardSequence p{.tokens = prompt, .block_table = blocks, .state_slot = 0, .mtp = true, .keep_hidden = true};
  std::vector<std::vector<DraftToken>> got[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(paged_->Forward({&p, 1}, *pools_[i]).ok());
    // MTP position 19 from the prompt's last hidden streams and a first token.
    const int32_t first = 77;
    const DraftSequence d{.first_slot = 20, .tokens = {&first, 1}, .hidden_row = 19, .block_table = blocks,
                          .state_slot = 0, .max_drafts = i == 0 ? 1 : 5};
    absl::StatusOr<std::vector<std::vector<DraftToken>>> r = paged_->Draft({&d, 1}, *pools_[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    got[i] = std::move(*r);
  }
  ASSERT_EQ(got[0][0].size(), 1u);
  ASSERT_EQ(got[1][0].size(), 5u);  // min_confidence 0: every chained run drafts
  EXPECT_EQ(got[0][0][0].token, got[1][0][0].token);
  EXPECT_EQ(Image(*pools_[0], 0, blocks), Image(*pools_[1], 0, blocks));
}

TEST_F(PagedV4SpeculativeTest, RefusesWhatItCannotDo) {
  const std::vector<int32_t> blocks = {0};
  const std::vector<int32_t> tokens = Tokens(20, 3);
  const ForwardSequence bad{.tokens = tokens, .block_table = blocks, .all_logits = true, .state_slot = 0,
                            .num_drafts = 20};
  EXPECT_EQ(paged_->Forward({&bad, 1}, *pools_[0]).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(paged_->AcceptDrafts(0, 1, *pools_[0]).code(), absl::StatusCode::kFailedPrecondition);
  // A model loaded without the MTP layer refuses to draft, and a checkpoint without one
  // (transformers' names) to load for it.
  absl::StatusOr<std::unique_ptr<PagedV4Model>> plain = PagedV4Model::Load(*dir_, {.num_threads = 1});
  ASSERT_TRUE(plain.ok());
  const int32_t t = 5;
  const DraftSequence d{.first_slot = 1, .tokens = {&t, 1}, .state_slot = 0};
  EXPECT_EQ((*plain)->Draft({&d, 1}, *pools_[0]).status().code(), absl::StatusCode::kFailedPrecondition);
  TempDir tmp;
  const std::string f32 = MakeV4Model(tmp, "f32", TinyV4Json(kVocab).dump());
  absl::StatusOr<std::unique_ptr<PagedV4Model>> none = PagedV4Model::Load(f32, {.num_threads = 1, .mtp = true});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_NE(none.status().message().find("mtp.0"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace tandem::v4
