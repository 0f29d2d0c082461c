// A throwaway public-key infrastructure for a cluster on one machine (`tandem serve-local`,
// integration tests): a private directory (0700, removed with the object) holding a fresh
// CA, a "node" certificate every cluster process presents as server and client, a
// client-only certificate for tools (`tandem status`), and a random cluster token. Made
// with Debian's openssl: EC P-256 keys, certificates valid two days for 127.0.0.1 and
// localhost.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class ThrowawayPki {
 public:
  // Makes the directory under `parent` (empty: $TMPDIR or /tmp) and everything in it.
  // Errors: INTERNAL when the directory cannot be made or openssl fails (with its
  // output), NOT_FOUND when there is no openssl on PATH.
  static absl::StatusOr<std::unique_ptr<ThrowawayPki>> Create(const std::string& parent = "");
  ~ThrowawayPki();  // removes the directory and everything in it
  ThrowawayPki(const ThrowawayPki&) = delete;
  ThrowawayPki& operator=(const ThrowawayPki&) = delete;

  const std::string& dir() const { return dir_; }
  std::string ca_cert() const { return dir_ + "/ca.pem"; }
  std::string node_cert() const { return dir_ + "/node.pem"; }
  std::string node_key() const { return dir_ + "/node.key"; }
  std::string client_cert() const { return dir_ + "/client.pem"; }
  std::string client_key() const { return dir_ + "/client.key"; }
  std::string token_file() const { return dir_ + "/cluster.token"; }

 private:
  explicit ThrowawayPki(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// Runs `argv` (argv[0] looked up on PATH), its output appended to `log`; OK when it exits
// with status 0, else INTERNAL with the log's tail. NOT_FOUND when it cannot be started.
absl::Status RunToCompletion(const std::vector<std::string>& argv, const std::string& log);

}  // namespace tandem
