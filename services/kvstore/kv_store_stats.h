// Plain counters and gauges of a kvstore instance (the metrics hooks: the admin /stats
// JSON and the KvStore.Stats RPC read them; Prometheus is wired on top of them later).
// Field meanings match tandem.v1.KvStatsResponse (kvstore.proto).
#pragma once

#include <cstdint>

namespace tandem::kvstore {

struct KvStoreStats {
  // Queries.
  int64_t lookups = 0;
  int64_t lookup_blocks = 0;
  int64_t lookup_hit_blocks = 0;
  // Reads (gets).
  int64_t get_blocks = 0;
  int64_t get_bytes = 0;
  int64_t get_misses = 0;
  int64_t hit_tokens = 0;
  // Writes (puts).
  int64_t reserved_blocks = 0;
  int64_t dedup_blocks = 0;
  int64_t no_room_blocks = 0;
  int64_t committed_blocks = 0;
  int64_t put_bytes = 0;
  int64_t rejected_blocks = 0;
  int64_t expired_reservations = 0;
  // DRAM tier.
  int64_t dram_evictions = 0;
  int64_t dram_blocks = 0;
  int64_t dram_bytes_used = 0;
  int64_t dram_capacity_bytes = 0;
  // SSD tier.
  int64_t disk_blocks = 0;
  int64_t disk_bytes_used = 0;
  int64_t disk_capacity_bytes = 0;
  int64_t disk_writes = 0;
  int64_t disk_write_failures = 0;
  int64_t disk_reads = 0;
  int64_t disk_evictions = 0;
  int64_t disk_corrupt_dropped = 0;
  int64_t disk_loaded_blocks = 0;
};

}  // namespace tandem::kvstore
