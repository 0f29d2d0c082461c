// The `tandem` binary as a user runs it: help, make-model, offline generation, errors.
#include <filesystem>

#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::BinaryPath;
using testing::RunProcess;
using testing::TempDir;

TEST(CliTest, HelpDocumentsEveryCommandAndFlag) {
  auto top = RunProcess({BinaryPath("tandem"), "--help"});
  EXPECT_EQ(top.exit_code, 0) << top.err;
  EXPECT_NE(top.out.find("make-model"), std::string::npos);
  EXPECT_NE(top.out.find("generate"), std::string::npos);
  auto mm = RunProcess({BinaryPath("tandem"), "make-model", "--help"});
  for (const char* flag : {"--preset", "--config", "--out", "--seed", "--dtype", "--shards", "--tokenizer-dir",
                           "--generated-tokenizer", "--vocab-size", "--weights-on-gpu", "--mtp-acceptance"}) {
    EXPECT_NE(mm.out.find(flag), std::string::npos) << flag;
  }
  auto gen = RunProcess({BinaryPath("tandem"), "generate", "--help"});
  for (const char* flag : {"--local", "--addr", "--model", "--max-tokens", "--temperature", "--top-p", "--top-k",
                           "--seed", "--stop", "--ignore-eos", "--expert-parallel", "--tensor-parallel",
                           "--data-parallel", "--fp8-decode"}) {
    EXPECT_NE(gen.out.find(flag), std::string::npos) << flag;
  }
  // A local engine's option asked of a cluster: refused, saying where it belongs.
  auto fp8 = RunProcess({BinaryPath("tandem"), "generate", "--fp8-decode", "hi"});
  EXPECT_NE(fp8.exit_code, 0);
  EXPECT_NE(fp8.err.find("--fp8-decode needs --local"), std::string::npos) << fp8.err;
  auto none = RunProcess({BinaryPath("tandem")});
  EXPECT_NE(none.exit_code, 0);
}

TEST(CliTest, ServeLocalPlacesReplicasOnDevicesAndRefusesBadOnes) {
  auto help = RunProcess({BinaryPath("tandem"), "serve-local", "--help"});
  for (const char* flag : {"--device", "--prefill-devices", "--decode-devices", "--aggregated", "--fp8-decode"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
  auto bad = RunProcess({BinaryPath("tandem"), "serve-local", "--prefill-devices", "cuda:0,gpu1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("'gpu1' is not a device"), std::string::npos) << bad.err;
  if (!std::filesystem::exists(BinaryPath("tandem-prefill"))) return;  // an engine-only build
  auto worker = RunProcess({BinaryPath("tandem-prefill"), "--help"});
  for (const char* flag :
       {"--kv-transfer", "--no-device-sampling", "--no-pipeline-steps", "--gpu-memory-utilization", "--fp8-decode"}) {
    EXPECT_NE(worker.out.find(flag), std::string::npos) << flag;
  }
  auto mode = RunProcess({BinaryPath("tandem-prefill"), "--kv-transfer", "nvlink"});
  EXPECT_NE(mode.exit_code, 0);
  EXPECT_NE(mode.err.find("--kv-transfer"), std::string::npos) << mode.err;
}

// A checkpoint whose weights are generated on the GPU at load says so on the CPU.
TEST(CliTest, WeightsOnGpuCheckpointNeedsAGpu) {
  TempDir tmp;
  auto mm = RunProcess({BinaryPath("tandem"), "make-model", "--preset", "tiny", "--generated-tokenizer",
                        "--weights-on-gpu", "--out", tmp.Sub("m")});
  ASSERT_EQ(mm.exit_code, 0) << mm.err;
  EXPECT_TRUE(std::filesystem::exists(tmp.Sub("m") + "/tandem_generated_weights.json"));
  EXPECT_FALSE(std::filesystem::exists(tmp.Sub("m") + "/model.safetensors"));
  auto gen = RunProcess({BinaryPath("tandem"), "generate", "--local", "--model", tmp.Sub("m"), "hi"});
  EXPECT_NE(gen.exit_code, 0);
  EXPECT_NE(gen.err.find("use --device cuda"), std::string::npos) << gen.err;
}

TEST(CliTest, MakeModelIsDeterministic) {
  TempDir tmp;
  for (const char* name : {"a", "b"}) {
    auto r = RunProcess({BinaryPath("tandem"), "make-model", "--preset", "tiny-v2", "--generated-tokenizer",
                         "--seed", "3", "--out", tmp.Sub(name)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(ReadFileToString(tmp.Sub("a") + "/" + file).value(), ReadFileToString(tmp.Sub("b") + "/" + file).value())
        << file;
  }
  auto bad = RunProcess({BinaryPath("tandem"), "make-model", "--preset", "huge", "--out", tmp.Sub("c")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown preset 'huge'"), std::string::npos) << bad.err;
}

TEST(CliTest, LocalGenerationStreamsTextAndIsReproducible) {
  TempDir tmp;
  const std::vector<std::string> env = {"TANDEM_CACHE_DIR=" + tmp.Sub("cache")};
  std::vector<std::string> cmd = {BinaryPath("tandem"), "generate", "--local", "--model", "tiny", "--max-tokens", "12",
                                  "--seed", "5", "--ignore-eos", "--threads", "2", "The quick brown fox"};
  auto first = RunProcess(cmd, env);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_FALSE(first.out.empty());
  EXPECT_NE(first.err.find("generated tokens: 12"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("TTFT"), std::string::npos);
  // The built-in model was generated into the cache directory and is reused.
  EXPECT_TRUE(std::filesystem::exists(tmp.Sub("cache")));
  auto second = RunProcess(cmd, env);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(first.out, second.out);

  cmd[cmd.size() - 1] = "A different prompt";
  auto other = RunProcess(cmd, env);
  EXPECT_NE(other.out, first.out);
}

// Ranks forked by `generate --local` (docs/parallel.md), with the experts and/or the dense
// parts split, or the sequences spread over the ranks (data-parallel attention; one
// prompt: the other ranks run every step with no rows): the text of one rank, sampled
// with a seed.
TEST(CliTest, LocalGenerationOnRanksIsOneRanks) {
  TempDir tmp;
  const std::vector<std::string> env = {"TANDEM_CACHE_DIR=" + tmp.Sub("cache")};
  const std::vector<std::string> cmd = {BinaryPath("tandem"), "generate", "--local", "--model", "tiny",
                                        "--max-tokens", "12", "--seed", "5", "--ignore-eos", "--threads", "1",
                                        "The quick brown fox"};
  auto one = RunProcess(cmd, env);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--expert-parallel", "2"},
           {"--expert-parallel", "4", "--tensor-parallel", "4"},
           {"--data-parallel", "2"},
           {"--data-parallel", "4", "--expert-parallel", "4"}}) {
    std::vector<std::string> c = cmd;
    c.insert(c.end() - 1, flags.begin(), flags.end());
    auto ranks = RunProcess(c, env);
    ASSERT_EQ(ranks.exit_code, 0) << ranks.err;
    std::string named;
    for (const std::string& f : flags) named += f + " ";
    EXPECT_EQ(ranks.out, one.out) << named;
    EXPECT_NE(ranks.err.find("generated tokens: 12"), std::string::npos) << ranks.err;
  }
  // TP under DP would need every rank's rows gathered before the split parts: refused.
  auto dp_tp = RunProcess(
      {BinaryPath("tandem"), "generate", "--local", "--data-parallel", "2", "--tensor-parallel", "2", "hi"}, env);
  EXPECT_NE(dp_tp.exit_code, 0);
  EXPECT_NE(dp_tp.err.find("not implemented"), std::string::npos) << dp_tp.err;
  auto dp_ep = RunProcess(
      {BinaryPath("tandem"), "generate", "--local", "--data-parallel", "2", "--expert-parallel", "4", "hi"}, env);
  EXPECT_NE(dp_ep.exit_code, 0);
  EXPECT_NE(dp_ep.err.find("same count"), std::string::npos) << dp_ep.err;
  auto mixed = RunProcess(
      {BinaryPath("tandem"), "generate", "--local", "--expert-parallel", "2", "--tensor-parallel", "4", "hi"}, env);
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_NE(mixed.err.find("same count"), std::string::npos) << mixed.err;
  // A cluster's ranks are its workers' (worker --data-parallel ...), not the client's.
  for (const char* flag : {"--expert-parallel", "--data-parallel"}) {
    auto remote = RunProcess({BinaryPath("tandem"), "generate", flag, "2", "hi"}, env);
    EXPECT_NE(remote.exit_code, 0) << flag;
    EXPECT_NE(remote.err.find("need --local"), std::string::npos) << remote.err;
  }
}

TEST(CliTest, GenerationErrorsAreClear) {
  TempDir tmp;
  auto missing = RunProcess({BinaryPath("tandem"), "generate", "--local", "--model", tmp.Sub("nope"), "hi"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("neither a checkpoint directory"), std::string::npos) << missing.err;
  auto nan = RunProcess({BinaryPath("tandem"), "generate", "--local", "--temperature", "nan", "hi"});
  EXPECT_NE(nan.exit_code, 0);
  auto nan_p = RunProcess({BinaryPath("tandem"), "generate", "--local", "--top-p", "NaN", "hi"});
  EXPECT_NE(nan_p.exit_code, 0);
  EXPECT_NE(nan_p.err.find("finite"), std::string::npos) << nan_p.err;
  auto remote = RunProcess({BinaryPath("tandem"), "generate", "hi"});
  EXPECT_NE(remote.exit_code, 0);
}

}  // namespace
}  // namespace tandem
