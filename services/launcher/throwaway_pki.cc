#include "services/launcher/throwaway_pki.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string ReadTail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

absl::Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

absl::StatusOr<std::string> RandomHex(size_t bytes) {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string raw(bytes, '\0');
  if (!in.read(raw.data(), static_cast<std::streamsize>(bytes))) return absl::InternalError("cannot read /dev/urandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

absl::Status RunToCompletion(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::NotFoundError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(rc)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(absl::StrJoin(args, " "), " failed; output:\n", ReadTail(log)));
}

absl::StatusOr<std::unique_ptr<ThrowawayPki>> ThrowawayPki::Create(const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  std::string tmpl = (fs::path(base) / "tandem-pki-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {  // mkdtemp makes it 0700
    return absl::InternalError(absl::StrCat("cannot create a private directory under ", base, ": ",
                                            std::strerror(errno)));
  }
  std::unique_ptr<ThrowawayPki> pki(new ThrowawayPki(tmpl));
  const std::string& d = pki->dir_;
  const std::string log = d + "/openssl.log";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // The CA.
  if (absl::Status s = RunToCompletion(with(with({"openssl", "req", "-x509"}, ec),
                                            {"-days", "2", "-subj", "/CN=tandem-throwaway-ca", "-keyout", d + "/ca.key",
                                             "-out", pki->ca_cert(), "-addext", "basicConstraints=critical,CA:TRUE",
                                             "-addext", "keyUsage=critical,keyCertSign,cRLSign"}),
                                       log);
      !s.ok()) {
    return s;
  }
  // Leaf certificates signed by it: the node one (server and client) and a client-only one.
  struct Leaf {
    std::string name, cn, usage, cert, key;
  };
  for (const Leaf& leaf : {Leaf{"node", "tandem-node", "serverAuth,clientAuth", pki->node_cert(), pki->node_key()},
                           Leaf{"client", "tandem-client", "clientAuth", pki->client_cert(), pki->client_key()}}) {
    const std::string csr = d + "/" + leaf.name + ".csr", ext = d + "/" + leaf.name + ".ext";
    if (absl::Status s = WriteFile(ext,
                                   absl::StrCat("basicConstraints=critical,CA:FALSE\n"
                                                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                                "extendedKeyUsage=",
                                                leaf.usage, "\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"),
                                   0600);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RunToCompletion(
            with(with({"openssl", "req", "-new"}, ec), {"-subj", "/CN=" + leaf.cn, "-keyout", leaf.key, "-out", csr}),
            log);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = RunToCompletion({"openssl", "x509", "-req", "-in", csr, "-CA", pki->ca_cert(), "-CAkey",
                                          d + "/ca.key", "-CAcreateserial", "-days", "2", "-extfile", ext, "-out",
                                          leaf.cert},
                                         log);
        !s.ok()) {
      return s;
    }
  }
  // Nobody signs anything more with this CA: its key goes now.
  std::error_code ec_remove;
  fs::remove(d + "/ca.key", ec_remove);
  absl::StatusOr<std::string> token = RandomHex(24);
  if (!token.ok()) return token.status();
  if (absl::Status s = WriteFile(pki->token_file(), *token + "\n", 0600); !s.ok()) return s;
  return pki;
}

ThrowawayPki::~ThrowawayPki() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace tandem
