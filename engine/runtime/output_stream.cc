#include "engine/runtime/output_stream.h"

namespace tandem {

bool OutputStream::Next(RequestOutput* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (final_returned_) return false;
  cv_.wait(lock, [this] { return pending_.has_value(); });
  *out = std::move(*pending_);
  pending_.reset();
  if (out->finished) final_returned_ = true;
  return true;
}

std::optional<RequestOutput> OutputStream::TryNext() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_) return std::nullopt;
  std::optional<RequestOutput> out = std::move(pending_);
  pending_.reset();
  if (out->finished) final_returned_ = true;
  return out;
}

void OutputStream::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void OutputStream::Push(RequestOutput output) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (final_pushed_) return;  // nothing follows the final output
    final_pushed_ = output.finished;
    if (!pending_) {
      pending_ = std::move(output);
    } else {
      RequestOutput& p = *pending_;
      p.token_ids.insert(p.token_ids.end(), output.token_ids.begin(), output.token_ids.end());
      p.text += output.text;
      for (auto& l : output.logprobs) p.logprobs.push_back(std::move(l));
      p.finished = output.finished;
      p.finish_reason = output.finish_reason;
      p.matched_stop = std::move(output.matched_stop);
      p.status = output.status;
      p.metrics = output.metrics;
      if (!output.last_hidden.empty()) p.last_hidden = std::move(output.last_hidden);
    }
    notify = listener_;
  }
  cv_.notify_all();
  if (notify) notify();
}

}  // namespace tandem
