#include "cli/bench/openai_backend.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/bench/sse_parser.h"

namespace tandem::cli {
namespace {

using Json = nlohmann::json;

double Seconds(BenchClock::duration d) { return std::chrono::duration<double>(d).count(); }

// `error.message` of an OpenAI error body, else the body's start.
std::string ErrorMessage(const std::string& body) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return body.substr(0, 200);
}

std::string StringOr(const Json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// One streamed request: its SSE events timed as they arrive.
class StreamCall {
 public:
  StreamCall(bool chat, BenchClock::time_point start, RequestRecord* record, std::function<void()> done)
      : chat_(chat), start_(start), record_(record), done_(std::move(done)) {}

  void OnHead(int status, const HttpHeaders& headers) {
    status_ = status;
    for (const auto& [name, value] : headers) {
      if (absl::EqualsIgnoreCase(name, "content-type")) content_type_ = value;
    }
    event_stream_ = absl::StartsWithIgnoreCase(content_type_, "text/event-stream");
  }

  void OnBody(std::string_view bytes, BenchClock::time_point at) {
    if (status_ != 200 || !event_stream_) {
      if (other_body_.size() < 4096) other_body_.append(bytes.substr(0, 4096 - other_body_.size()));
      return;
    }
    sse_.Feed(bytes, [&](const std::string& payload) { OnEvent(payload, at); });
  }

  void OnDone(const absl::Status& transport) {
    RequestRecord& r = *record_;
    r.e2e_s = Seconds(BenchClock::now() - start_);
    auto fail = [&](std::string error_class, std::string message) {
      r.ok = false;
      r.error_class = std::move(error_class);
      r.error = std::move(message);
    };
    if (!transport.ok()) {
      fail(absl::IsDeadlineExceeded(transport) ? "timeout" : "connection", std::string(transport.message()));
    } else if (status_ != 200) {
      fail(absl::StrCat("http ", status_), absl::StrCat("HTTP ", status_, ": ", ErrorMessage(other_body_)));
    } else if (!event_stream_) {
      fail("protocol", absl::StrCat("the answer is not an event stream (Content-Type '", content_type_,
                                    "'): was stream: true ignored?"));
    } else if (!stream_error_.empty()) {
      fail(stream_error_class_, stream_error_);
    } else if (!protocol_error_.empty()) {
      fail("protocol", protocol_error_);
    } else if (!saw_done_) {
      fail("protocol", "the stream ended without data: [DONE]");
    } else if (!saw_usage_) {
      fail("protocol", "the stream had no usage event (stream_options.include_usage)");
    } else {
      r.ok = true;
      // Output that never came as text (every piece empty): first seen at the end.
      if (r.chunks == 0) r.ttft_s = r.e2e_s;
    }
    std::function<void()> done = std::move(done_);
    done();
  }

 private:
  void OnEvent(const std::string& payload, BenchClock::time_point at) {
    if (saw_done_) return;
    if (payload == "[DONE]") {
      saw_done_ = true;
      return;
    }
    const Json j = Json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      if (protocol_error_.empty()) protocol_error_ = absl::StrCat("an event is not a JSON object: ", payload.substr(0, 200));
      return;
    }
    if (auto e = j.find("error"); e != j.end() && stream_error_.empty()) {
      const Json code = e->is_object() && e->contains("code") ? (*e)["code"] : Json();
      stream_error_class_ = absl::StrCat("stream error ", code.is_number_integer() ? std::to_string(code.get<int64_t>())
                                                                                 : std::string("?"));
      stream_error_ = absl::StrCat("error event mid-stream: ", StringOr(*e, "message"));
      return;
    }
    if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
      const Json& choice = (*c)[0];
      bool output = false;
      if (chat_) {
        const Json delta = choice.is_object() && choice.contains("delta") ? choice["delta"] : Json();
        output = !StringOr(delta, "content").empty() || !StringOr(delta, "reasoning_content").empty() ||
                 !StringOr(delta, "reasoning").empty() ||
                 (delta.is_object() && delta.contains("tool_calls") && delta["tool_calls"].is_array() &&
                  !delta["tool_calls"].empty());
      } else {
        output = !StringOr(choice, "text").empty();
      }
      if (output) {
        if (record_->chunks == 0) {
          record_->ttft_s = Seconds(at - start_);
        } else {
          record_->itl_s.push_back(Seconds(at - last_));
        }
        ++record_->chunks;
        last_ = at;
      }
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      saw_usage_ = true;
      record_->output_tokens = u->value("completion_tokens", 0);
      record_->prompt_tokens = u->value("prompt_tokens", record_->prompt_tokens);
      if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
        record_->cached_prompt_tokens = d->value("cached_tokens", 0);
      }
    }
  }

  const bool chat_;
  const BenchClock::time_point start_;
  RequestRecord* const record_;
  std::function<void()> done_;
  BenchClock::time_point last_;
  int status_ = 0;
  std::string content_type_;
  bool event_stream_ = false;
  std::string other_body_;
  SseParser sse_;
  bool saw_done_ = false;
  bool saw_usage_ = false;
  std::string stream_error_, stream_error_class_, protocol_error_;
};

class OpenAiBackend : public BenchBackend {
 public:
  OpenAiBackend(OpenAiBackendOptions o, std::unique_ptr<HttpClient> client)
      : o_(std::move(o)), client_(std::move(client)) {
    // vLLM and Tandem serve /tokenize and /detokenize beside /v1, not under it.
    root_ = o_.base_url.path;
    if (absl::EndsWith(root_, "/v1")) root_.resize(root_.size() - 3);
    headers_ = {{"Content-Type", "application/json"}};
    if (!o_.api_key.empty()) headers_.emplace_back("Authorization", "Bearer " + o_.api_key);
  }

  std::string name() const override { return Chat() ? "openai-chat" : "openai-completions"; }

  absl::StatusOr<ServedModel> Connect() override {
    absl::StatusOr<HttpWholeResponse> models = client_->Fetch("GET", o_.base_url.path + "/models", headers_, "", 10);
    const std::string where = absl::StrCat("http://", o_.base_url.host, ":", o_.base_url.port, o_.base_url.path);
    if (!models.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot reach an OpenAI-compatible API at ", where, ": ",
                                                 models.status().message()));
    }
    if (models->status != 200) {
      return absl::UnavailableError(absl::StrCat(where, "/models answered HTTP ", models->status, ": ",
                                                 ErrorMessage(models->body)));
    }
    const Json j = Json::parse(models->body, nullptr, false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        StringOr(j["data"][0], "id").empty()) {
      return absl::UnavailableError(absl::StrCat(where, "/models lists no model"));
    }
    ServedModel served{.id = j["data"][0]["id"].get<std::string>()};
    model_ = o_.settings.model.empty() ? served.id : o_.settings.model;
    return served;
  }

  absl::Status Prepare(std::vector<BenchPrompt>* prompts) override {
    if (!Chat()) return absl::OkStatus();
    for (BenchPrompt& p : *prompts) {
      absl::StatusOr<HttpWholeResponse> r = Detokenize(p.token_ids);
      if (!r.ok()) return r.status();
      const Json j = Json::parse(r->body, nullptr, false);
      if (r->status != 200 || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
        return absl::FailedPreconditionError(absl::StrCat("openai-chat needs the prompts' text from ", root_,
                                                          "/detokenize, which answered HTTP ", r->status, ": ",
                                                          ErrorMessage(r->body)));
      }
      p.text = j["prompt"].get<std::string>();
    }
    return absl::OkStatus();
  }

  void Start(const BenchPrompt& prompt, BenchClock::time_point run_start, RequestRecord* record,
             std::function<void()> done) override {
    Json body = {{"model", model_},
                 {"max_tokens", prompt.max_tokens},
                 {"temperature", o_.settings.temperature},
                 {"seed", prompt.seed},
                 {"ignore_eos", o_.settings.ignore_eos},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (Chat()) {
      body["messages"] = Json::array({{{"role", "user"}, {"content", prompt.text}}});
    } else {
      body["prompt"] = prompt.token_ids;
    }
    std::string text = body.dump(-1, ' ', false, Json::error_handler_t::replace);
    const auto start = BenchClock::now();
    record->start_s = Seconds(start - run_start);
    record->prompt_tokens = static_cast<int32_t>(prompt.token_ids.size());
    auto call = std::make_shared<StreamCall>(Chat(), start, record, std::move(done));
    HttpResponseHandlers h;
    h.on_head = [call](int status, const HttpHeaders& headers) { call->OnHead(status, headers); };
    h.on_body = [call](std::string_view bytes, BenchClock::time_point at) { call->OnBody(bytes, at); };
    h.on_done = [call](const absl::Status& s) { call->OnDone(s); };
    const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(o_.settings.timeout_s * 1000));
    client_->Send("POST", o_.base_url.path + (Chat() ? "/chat/completions" : "/completions"), headers_,
                  std::move(text), deadline, std::move(h));
  }

  Json TransportStats() const override { return {{"http_connections_opened", client_->connections_opened()}}; }

 private:
  bool Chat() const { return o_.endpoint == OpenAiEndpoint::kChat; }

  absl::StatusOr<HttpWholeResponse> Detokenize(const std::vector<int32_t>& ids) {
    const Json body = {{"model", model_}, {"tokens", ids}};
    return client_->Fetch("POST", root_ + "/detokenize", headers_, body.dump(), 30);
  }

  // The largest id /detokenize accepts, plus one: a binary search over [0, 128000) (the
  // dataset draws no id above that).
  absl::StatusOr<int64_t> ProbeVocabSize() override {
    auto accepted = [&](int32_t id) -> absl::StatusOr<bool> {
      absl::StatusOr<HttpWholeResponse> r = Detokenize({id});
      if (!r.ok()) return r.status();
      return r->status == 200;
    };
    int32_t lo = 0, hi = 128000 - 1;
    absl::StatusOr<bool> top = accepted(hi);
    if (!top.ok()) return top.status();
    if (*top) return 128000;
    absl::StatusOr<bool> bottom = accepted(lo);
    if (!bottom.ok()) return bottom.status();
    if (!*bottom) {
      return absl::FailedPreconditionError(absl::StrCat("cannot learn the vocabulary size from ", root_,
                                                        "/detokenize: pass --vocab-size"));
    }
    while (hi - lo > 1) {  // lo accepted, hi refused
      const int32_t mid = lo + (hi - lo) / 2;
      absl::StatusOr<bool> ok = accepted(mid);
      if (!ok.ok()) return ok.status();
      (*ok ? lo : hi) = mid;
    }
    return static_cast<int64_t>(lo) + 1;
  }

  const OpenAiBackendOptions o_;
  std::unique_ptr<HttpClient> client_;
  std::string root_;
  HttpHeaders headers_;
  std::string model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeOpenAiBackend(OpenAiBackendOptions options) {
  absl::StatusOr<std::unique_ptr<HttpClient>> client = HttpClient::Create(options.base_url, options.threads);
  if (!client.ok()) return client.status();
  return std::unique_ptr<BenchBackend>(new OpenAiBackend(std::move(options), std::move(*client)));
}

}  // namespace tandem::cli
