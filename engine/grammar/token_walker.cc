#include "engine/grammar/token_walker.h"

#include <algorithm>
#include <cstdint>

#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {
// The deadline is read after this many items of work (a push may add one item or, in
// a large chart, hundreds of thousands).
constexpr uint64_t kWorkPerDeadlineCheck = 1 << 16;
}  // namespace

TokenWalker::TokenWalker(const GrammarVocabulary& vocabulary, EarleyRecognizer* recognizer, absl::Time deadline)
    : vocab_(vocabulary), rec_(*recognizer), deadline_(deadline) {}

bool TokenWalker::Push(uint8_t byte) {
  if (!rec_.Push(byte)) return false;
  ++pushes_;
  if (rec_.work() - checked_at_work_ >= kWorkPerDeadlineCheck) {
    checked_at_work_ = rec_.work();
    if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) expired_ = true;
  }
  return true;
}

// The recognizer is at `node` (its path pushed); exit_depths_ covers depths 0..depth(node).
void TokenWalker::WalkSubtree(int32_t node) {
  const auto& trie = vocab_.trie();
  const auto& sorted = vocab_.sorted_tokens();
  const GrammarVocabulary::TrieNode& n = trie[node];
  for (int32_t k = n.tok_begin; k < n.tok_here_end; ++k) accepted_->push_back(sorted[k]);
  if (node + 1 >= n.end) return;
  const ByteSet next = rec_.NextBytes();
  const size_t sets = rec_.num_sets();
  for (int32_t c = node + 1; c < n.end; c = trie[c].end) {
    if (expired_) return;
    if (!next.Contains(trie[c].byte)) {
      Uncertain(c);
      continue;
    }
    const bool pushed = Push(trie[c].byte);
    TANDEM_CHECK(pushed);
    Pushed(trie[c].depth);
    WalkSubtree(c);
    PoppedTo(n.depth);
    rec_.PopTo(sets);
  }
}

absl::Status TokenWalker::Walk(std::span<const int32_t> nodes, std::vector<int32_t>* accepted,
                               std::vector<UncertainSubtree>* uncertain) {
  accepted_ = accepted;
  uncertain_ = uncertain;
  base_ = rec_.num_sets();
  const auto& trie = vocab_.trie();
  exit_depths_.clear();
  Pushed(0);
  std::string_view path;  // pushed so far, beyond the root
  for (int32_t node : nodes) {
    const std::string_view want = vocab_.NodePath(node);
    size_t lcp = 0;
    while (lcp < path.size() && lcp < want.size() && path[lcp] == want[lcp]) ++lcp;
    rec_.PopTo(base_ + lcp);
    PoppedTo(lcp);
    path = want.substr(0, lcp);
    bool alive = true;
    for (size_t d = lcp; d < want.size(); ++d) {
      if (!Push(static_cast<uint8_t>(want[d]))) {
        alive = false;
        break;
      }
      path = want.substr(0, d + 1);
      Pushed(d + 1);
    }
    if (!alive) {
      // Dead on the way down, after `path`: uncertain if an exit was reached at or
      // above the byte that failed.
      Uncertain(node);
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

absl::Status TokenWalker::WalkShifted(int32_t node, int32_t offset, std::vector<int32_t>* accepted) {
  accepted_ = accepted;
  ignored_.clear();
  uncertain_ = &ignored_;
  base_ = rec_.num_sets();
  exit_depths_.clear();
  const std::string_view path = vocab_.NodePath(node).substr(offset);
  bool alive = true;
  for (char c : path) {
    if (!Push(static_cast<uint8_t>(c))) {
      alive = false;
      break;
    }
  }
  if (alive) WalkSubtree(node);
  rec_.PopTo(base_);
  if (expired_) return absl::DeadlineExceededError("token walk passed its deadline");
  return absl::OkStatus();
}

void TokenWalker::SortSuffixes(const GrammarVocabulary& vocabulary, std::vector<TokenSuffix>* suffixes) {
  const auto view = [&](const TokenSuffix& s) {
    return std::string_view(vocabulary.token_bytes(s.token)).substr(s.offset);
  };
  std::sort(suffixes->begin(), suffixes->end(), [&](const TokenSuffix& a, const TokenSuffix& b) {
    const std::string_view x = view(a), y = view(b);
    if (x != y) return x < y;
    return a.token != b.token ? a.token < b.token : a.offset < b.offset;
  });
  suffixes->erase(std::unique(suffixes->begin(), suffixes->end(),
                              [](const TokenSuffix& a, const TokenSuffix& b) {
                                return a.token == b.token && a.offset == b.offset;
                              }),
                  suffixes->end());
}

absl::Status TokenWalker::WalkSuffixes(std::span<const TokenSuffix> suffixes, std::vector<int32_t>* accepted) {
  base_ = rec_.num_sets();
  std::string_view path;    // pushed so far
  std::string_view failed;  // a prefix whose last byte was refused (after the previous `path`)
  for (size_t i = 0; i < suffixes.size(); ++i) {
    const std::string_view want = std::string_view(vocab_.token_bytes(suffixes[i].token)).substr(suffixes[i].offset);
    if (!failed.empty() && want.substr(0, failed.size()) == failed) continue;  // sorted: refused too
    failed = {};
    size_t lcp = 0;
    while (lcp < path.size() && lcp < want.size() && path[lcp] == want[lcp]) ++lcp;
    rec_.PopTo(base_ + lcp);
    path = want.substr(0, lcp);
    bool alive = true;
    for (size_t d = lcp; d < want.size(); ++d) {
      if (!Push(static_cast<uint8_t>(want[d]))) {
        alive = false;
        failed = want.substr(0, d + 1);
        break;
      }
      path = want.substr(0, d + 1);
    }
    if (alive) accepted->push_back(static_cast<int32_t>(i));
    if (expired_) break;
  }
  rec_.PopTo(base_);
  if (expired_) return absl::DeadlineExceededError("token walk passed its deadline");
  return absl::OkStatus();
}

}  // namespace tandem::grammar
