// The model identity the router admits (engine/runtime/kv_layout.h): a replica serving a
// "fine-tune" of the router's model — the same config.json, tokenizer and safetensors
// headers, other tensor bytes — has another KV layout fingerprint and is refused, so its KV
// never mixes with the real model's; a replica of the real model joins as before.
#include <stdlib.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "engine/util/mapped_file.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

int DecodeReplicas(const LocalCluster& cluster) {
  auto stub = testing::ClusterStub(cluster);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListReplicasResponse r;
  EXPECT_TRUE(stub->ListReplicas(&ctx, v1::ListReplicasRequest(), &r).ok());
  int n = 0;
  for (const v1::ReplicaInfo& info : r.replicas()) n += info.role() == v1::ROLE_DECODE;
  return n;
}

TEST(ModelIdentityTest, AReplicaOfAFineTuneIsRefusedByTheRouter) {
  auto cluster = testing::StartCluster(0, 1, 0);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(DecodeReplicas(*cluster), 1);

  // The fine-tune: a copy of the model with a few tensor bytes changed.
  std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-identity-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  const std::string tuned = dir + "/tiny-finetune";
  std::filesystem::copy(testing::TinyModelDir(), tuned, std::filesystem::copy_options::recursive);
  const std::string weights = tuned + "/model.safetensors";
  ASSERT_TRUE(std::filesystem::exists(weights)) << "the tiny model is expected in one safetensors file";
  absl::StatusOr<std::string> bytes = ReadFileToString(weights);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  for (size_t i = 1; i <= 64; ++i) (*bytes)[bytes->size() - 7 * i] ^= 0x10;
  ASSERT_TRUE(WriteStringToFile(weights, *bytes).ok());

  // With the cluster's credentials, so that the layout is what refuses it.
  std::vector<std::string> argv = {testing::BinaryPath("tandem-decode"), "--role", "decode", "--router",
                                   cluster->router_internal_address(), "--model", tuned, "--ready-file",
                                   dir + "/tuned.ready.json"};
  for (const std::string& a : cluster->InternalAuthArgs()) argv.push_back(a);
  testing::ProcessResult refused = testing::RunProcess(argv, {}, 60);
  EXPECT_NE(refused.err.find("layout_fingerprint"), std::string::npos) << refused.err;
  EXPECT_NE(refused.exit_code, 0) << "a replica of another model's weights was admitted";
  EXPECT_FALSE(std::filesystem::exists(dir + "/tuned.ready.json"));
  EXPECT_EQ(DecodeReplicas(*cluster), 1);

  // The real model still joins.
  absl::StatusOr<std::string> added = cluster->AddWorker("decode");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(DecodeReplicas(*cluster), 2);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace tandem
