#include "engine/grammar/token_walker.h"

#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {
constexpr uint32_t kPushesPerDeadlineCheck = 4096;
}  // namespace

TokenWalker::TokenWalker(const GrammarVocabulary& vocabulary, EarleyRecognizer* recognizer, absl::Time deadline)
    : vocab_(vocabulary), rec_(*recognizer), deadline_(deadline) {}

bool TokenWalker::Push(uint8_t byte) {
  if (!rec_.Push(byte)) return false;
  ++pushes_;
  if (++until_check_ >= kPushesPerDeadlineCheck) {
    until_check_ = 0;
    if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) expired_ = true;
  }
  return true;
}

// The recognizer is at `node` (its path pushed); exited_ covers depths 0..depth(node).
void TokenWalker::WalkSubtree(int32_t node) {
  const auto& trie = vocab_.trie();
  const auto& sorted = vocab_.sorted_tokens();
  const GrammarVocabulary::TrieNode& n = trie[node];
  for (int32_t k = n.tok_begin; k < n.tok_here_end; ++k) accepted_->push_back(sorted[k]);
  if (node + 1 >= n.end) return;
  const bool exited = exited_[n.depth] != 0;
  const ByteSet next = rec_.NextBytes();
  const size_t sets = rec_.num_sets();
  for (int32_t c = node + 1; c < n.end; c = trie[c].end) {
    if (expired_) return;
    if (!next.Contains(trie[c].byte)) {
      if (exited) uncertain_->push_back(c);
      continue;
    }
    const bool pushed = Push(trie[c].byte);
    TANDEM_CHECK(pushed);
    exited_.push_back(exited || rec_.HasExit());
    WalkSubtree(c);
    exited_.pop_back();
    rec_.PopTo(sets);
  }
}

absl::Status TokenWalker::Walk(std::span<const int32_t> nodes, std::vector<int32_t>* accepted,
                               std::vector<int32_t>* uncertain) {
  accepted_ = accepted;
  uncertain_ = uncertain;
  base_ = rec_.num_sets();
  const auto& trie = vocab_.trie();
  exited_.assign(1, rec_.HasExit());
  std::string_view path;  // pushed so far, beyond the root
  for (int32_t node : nodes) {
    const std::string_view want = vocab_.NodePath(node);
    size_t lcp = 0;
    while (lcp < path.size() && lcp < want.size() && path[lcp] == want[lcp]) ++lcp;
    rec_.PopTo(base_ + lcp);
    exited_.resize(lcp + 1);
    path = want.substr(0, lcp);
    bool alive = true;
    for (size_t d = lcp; d < want.size(); ++d) {
      if (!Push(static_cast<uint8_t>(want[d]))) {
        alive = false;
        break;
      }
      exited_.push_back(exited_.back() || rec_.HasExit());
      path = want.substr(0, d + 1);
    }
    if (!alive) {
      // Dead on the way down, after `path`: the subtree is uncertain if an exit was
      // reached at or above the byte that failed.
      if (exited_.back()) uncertain->push_back(node);
    } else {
      TANDEM_CHECK(rec_.num_sets() == base_ + trie[node].depth);
      WalkSubtree(node);
    }
    if (expired_) break;
  }
  rec_.PopTo(base_);
  if (expired_) return absl::DeadlineExceededError("token walk passed its deadline");
  return absl::OkStatus();
}

}  // namespace tandem::grammar
