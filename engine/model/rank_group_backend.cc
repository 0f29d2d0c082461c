#include "engine/model/rank_group_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/data_parallel.h"
#include "engine/model/rank_step.h"
#include "engine/parallel/rank_processes.h"
#include "engine/parallel/shm_collectives.h"
#include "engine/util/status_macros.h"

namespace tandem {
namespace {

// What rank 0 broadcasts before each message: its kind and the payload's size (the
// payload follows in a second broadcast: every rank must give Broadcast the same size).
enum MessageKind : int64_t { kStep = 1, kEnd = 2 };
struct Header {
  int64_t kind = 0;
  int64_t bytes = 0;
};

absl::Status BroadcastHeader(parallel::Collectives& group, Header& h) {
  return group.Broadcast(std::as_writable_bytes(std::span<Header>(&h, 1)), /*root=*/0);
}

// The shared host pool: anonymous shared memory mapped before the fork, so that every
// rank has it at its own address; pages exist once written.
struct SharedPool {
  std::shared_ptr<void> mapping;
  std::span<std::byte> bytes;
};

absl::StatusOr<SharedPool> MapSharedPool(size_t n) {
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("rank group: cannot map a shared KV pool of ", n, " bytes"));
  }
  return SharedPool{.mapping = std::shared_ptr<void>(m, [n](void* p) { ::munmap(p, n); }),
                    .bytes = {static_cast<std::byte*>(m), n}};
}

class RankGroupBackend : public ModelBackend {
 public:
  RankGroupBackend(std::unique_ptr<parallel::Collectives> group, std::unique_ptr<CpuBackend> local,
                   std::unique_ptr<parallel::RankProcesses> followers, SharedPool pool)
      : group_(std::move(group)), local_(std::move(local)), followers_(std::move(followers)),
        pool_(std::move(pool)) {}

  ~RankGroupBackend() override {
    if (group_ok_) {
      Header end{.kind = kEnd};
      (void)BroadcastHeader(*group_, end);
    }
    // The other ranks exit once they have the end (or the group failed); any still
    // running after that is killed.
    for (const parallel::RankExit& e : followers_->Wait(absl::Seconds(10))) {
      // (RankProcesses counts the forked ranks from 0: they are ranks 1..W-1 here.)
      if (e.signal != 0) {
        std::fprintf(stderr, "rank group: rank %d (pid %d) ended by signal %d\n", e.rank + 1, e.pid, e.signal);
      } else if (!e.ok()) {
        std::fprintf(stderr, "rank group: rank %d (pid %d) exited with %d\n", e.rank + 1, e.pid, e.exit_code);
      }
    }
  }

  const ModelConfig& config() const override { return local_->config(); }
  std::string device_name() const override {
    return absl::StrCat("cpu (rank 0 of ", group_->world_size(), ")");
  }
  bool kv_in_host_pool() const override { return true; }
  int data_parallel_ranks() const override {
    return local_->model().layout().data_parallel ? group_->world_size() : 1;
  }
  std::span<std::byte> shared_host_pool() override { return pool_.bytes; }

  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    if (!group_ok_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the rank group failed at an earlier step (", group_error_, ")"));
    }
    // The ranks compute in the memory they share: a pool elsewhere would be rank 0's alone.
    if (host.memory().data() + host.StreamOffset(0) != pool_.bytes.data()) {
      return absl::InternalError("rank group: the engine's KV pool is not the memory the ranks share");
    }
    std::vector<std::byte> plan = EncodeRankStep(batch, host.geometry().num_blocks);
    Header h{.kind = kStep, .bytes = static_cast<int64_t>(plan.size())};
    absl::Status s = BroadcastHeader(*group_, h);
    if (s.ok()) s = group_->Broadcast(plan, /*root=*/0);
    if (!s.ok()) return Failed(s);
    absl::StatusOr<std::vector<float>> logits;
    if (data_parallel_ranks() > 1) {
      // This rank's sequences, the others' logits gathered. The gather ends the pass on
      // every rank, so every rank's KV of the step is written when it returns: the
      // per-layer hook (KV export) runs then, over every layer, since another rank's
      // sequence's layer is not known to be written before.
      LatentKvCache cache = LatentKvCache::Of(host);
      DeepseekForwardOptions o = ForDeepseek(options);
      o.after_layer_kv = nullptr;
      logits = ForwardDataParallel(*group_, local_->model(), batch, cache, o);
      if (logits.ok() && options.after_layer_kv) {
        for (int64_t layer = 0; layer < cache.num_layers(); ++layer) options.after_layer_kv(layer);
      }
    } else {
      logits = local_->Forward(batch, host, options);
      // EP alone ends its last collective in the last MoE layer: a rank could still be
      // writing a later layer's KV into the shared pool when this returns.
      if (logits.ok() && !local_->model().layout().tensor_parallel) {
        if (absl::Status b = group_->Barrier(); !b.ok()) return Failed(b);
      }
    }
    // A collective's error inside the pass leaves the group unusable; an invalid batch
    // was refused by every rank alike before any collective of the pass.
    if (!logits.ok() && logits.status().code() != absl::StatusCode::kInvalidArgument) return Failed(logits.status());
    return logits;
  }

  const std::vector<pid_t>& follower_pids() const { return followers_->pids(); }

 private:
  absl::Status Failed(absl::Status s) {
    group_ok_ = false;
    group_error_ = s.ToString();
    return s;
  }

  std::unique_ptr<parallel::Collectives> group_;
  std::unique_ptr<CpuBackend> local_;
  std::unique_ptr<parallel::RankProcesses> followers_;
  SharedPool pool_;
  bool group_ok_ = true;
  std::string group_error_;
};

DeepseekModel::LoadOptions RankLoadOptions(const BackendOptions& backend, const RankGroupOptions& g, int world,
                                           parallel::Collectives& group) {
  DeepseekModel::LoadOptions o;
  // The ranks share the machine's cores.
  o.num_threads = backend.num_threads > 0
                      ? backend.num_threads
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world);
  o.group = &group;
  o.expert_parallel = g.expert_parallel > 1;
  o.tensor_parallel = g.tensor_parallel > 1;
  o.data_parallel = g.data_parallel > 1;
  return o;
}

parallel::ShmGroupOptions ShmOptions(const RankGroupOptions& g, int world, int rank) {
  parallel::ShmGroupOptions o;
  o.name = g.name;
  o.world_size = world;
  o.rank = rank;
  o.timeout = g.timeout;
  return o;
}

}  // namespace

absl::StatusOr<int> RankGroupWorld(const RankGroupOptions& g, const BackendOptions& backend) {
  const int d = g.data_parallel, e = g.expert_parallel, t = g.tensor_parallel;
  if (d < 1 || e < 1 || t < 1) {
    return absl::InvalidArgumentError("--data-parallel, --expert-parallel and --tensor-parallel must be at least 1");
  }
  const int world = std::max({d, e, t});
  if (world == 1) return 1;
  if (world > parallel::kShmMaxWorld) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", parallel::kShmMaxWorld, " ranks, not ", world));
  }
  if (d > 1 && t > 1) {
    return absl::UnimplementedError(
        "--tensor-parallel with --data-parallel: the split LM head and dense MLPs would need every rank's rows "
        "gathered first, which is not implemented (docs/parallel.md); use --data-parallel with "
        "--expert-parallel");
  }
  if (d > 1 && e > 1 && d != e) {
    return absl::InvalidArgumentError(absl::StrCat("--data-parallel ", d, " and --expert-parallel ", e,
                                                   " run over the same ranks: give them the same count, or one "
                                                   "of them 1"));
  }
  if (e > 1 && t > 1 && e != t) {
    return absl::InvalidArgumentError(absl::StrCat("--expert-parallel ", e, " and --tensor-parallel ", t,
                                                   " split over the same ranks: give them the same count, or one "
                                                   "of them 1"));
  }
  if (backend.device != "cpu") {
    return absl::UnimplementedError(absl::StrCat("--device ", backend.device,
                                                 ": ranks run on the CPU backend only for now (the NCCL backend "
                                                 "is docs/parallel.md step 4)"));
  }
  if (backend.mtp) {
    return absl::UnimplementedError("speculative decoding (the MTP layer) does not run split over ranks yet");
  }
  return world;
}

absl::StatusOr<std::unique_ptr<ModelBackend>> StartCpuRankGroup(const std::string& dir,
                                                                const BackendOptions& backend,
                                                                const RankGroupOptions& g) {
  ASSIGN_OR_RETURN(const int world, RankGroupWorld(g, backend));
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  if (config.model_type != "deepseek_v2" && config.model_type != "deepseek_v3") {
    return absl::FailedPreconditionError(absl::StrCat("ranks run DeepSeek-V2/V3 models only, not model_type '",
                                                      config.model_type, "'"));
  }
  if (g.kv_cache_bytes <= 0) return absl::InvalidArgumentError("rank group: kv_cache_bytes must be positive");
  const int64_t pools = g.data_parallel > 1 ? g.data_parallel : 1;
  ASSIGN_OR_RETURN(SharedPool pool, MapSharedPool(static_cast<size_t>(pools * g.kv_cache_bytes)));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::RankProcesses> followers,
                   parallel::RankProcesses::Start(world - 1, [&](int i) {
                     const int rank = i + 1;
                     absl::StatusOr<std::unique_ptr<parallel::ShmCollectives>> group =
                         parallel::ShmCollectives::Open(ShmOptions(g, world, rank));
                     absl::Status s = group.status();
                     if (s.ok()) {
                       absl::StatusOr<std::unique_ptr<DeepseekModel>> model =
                           DeepseekModel::Load(dir, RankLoadOptions(backend, g, world, **group));
                       s = model.ok() ? RunFollowerRank(**group, **model, pool.bytes) : model.status();
                     }
                     if (s.ok()) return 0;
                     std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
                     return 1;
                   }));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::ShmCollectives> group,
                   parallel::ShmCollectives::Open(ShmOptions(g, world, 0)));
  ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model,
                   DeepseekModel::Load(dir, RankLoadOptions(backend, g, world, *group)));
  return std::unique_ptr<ModelBackend>(new RankGroupBackend(
      std::move(group), std::make_unique<CpuBackend>(std::move(model)), std::move(followers), std::move(pool)));
}

std::vector<pid_t> RankGroupPids(ModelBackend& backend) {
  auto* group = dynamic_cast<RankGroupBackend*>(&backend);
  return group != nullptr ? group->follower_pids() : std::vector<pid_t>{};
}

absl::Status RunFollowerRank(parallel::Collectives& group, DeepseekModel& model, std::span<std::byte> pool) {
  std::optional<LatentKvCache> cache;
  std::vector<std::byte> bytes;
  for (;;) {
    Header h;
    RETURN_IF_ERROR(BroadcastHeader(group, h));
    if (h.kind == kEnd) return absl::OkStatus();
    if (h.kind != kStep || h.bytes < 0) {
      return absl::InternalError(absl::StrCat("rank group: unknown message ", h.kind, " from rank 0"));
    }
    bytes.resize(static_cast<size_t>(h.bytes));
    RETURN_IF_ERROR(group.Broadcast(bytes, /*root=*/0));
    ASSIGN_OR_RETURN(const RankStep plan, DecodeRankStep(bytes));
    // Rank 0's pool, in the memory shared with it.
    if (!cache || cache->num_blocks() != plan.kv_blocks) {
      const ModelConfig& c = model.config();
      if (LatentKvCache::BytesFor(c.num_hidden_layers, plan.kv_blocks, c.kv_entry_dim()) > pool.size()) {
        return absl::InternalError(absl::StrCat("rank group: a pool of ", plan.kv_blocks,
                                                " blocks does not fit the shared memory of ", pool.size(), " bytes"));
      }
      cache.emplace(reinterpret_cast<float*>(pool.data()), c.num_hidden_layers, plan.kv_blocks, c.kv_entry_dim());
    }
    const ParallelLayout& layout = model.layout();
    absl::StatusOr<std::vector<float>> logits = layout.data_parallel
                                                    ? ForwardDataParallel(group, model, plan.batch, *cache)
                                                    : model.Forward(plan.batch, *cache);
    if (!logits.ok() && logits.status().code() != absl::StatusCode::kInvalidArgument) return logits.status();
    // (Rank 0's Forward says why.)
    if (logits.ok() && !layout.data_parallel && !layout.tensor_parallel) RETURN_IF_ERROR(group.Barrier());
  }
}

}  // namespace tandem
