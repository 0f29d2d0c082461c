#include "services/kvstore/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace tandem::kvstore {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'T', 'K', 'V', 'B', 'L', 'K', '\0', '\1'};
constexpr uint32_t kVersion = 1;

struct Header {
  uint64_t fingerprint = 0;
  uint64_t hash = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T LoadValue(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void Encode(const Header& h, char out[DiskTier::kHeaderBytes]) {
  std::memset(out, 0, DiskTier::kHeaderBytes);
  std::memcpy(out, kMagic, sizeof kMagic);
  Store<uint32_t>(out + 8, kVersion);
  Store<uint32_t>(out + 12, static_cast<uint32_t>(DiskTier::kHeaderBytes));
  Store<uint64_t>(out + 16, h.fingerprint);
  Store<uint64_t>(out + 24, h.hash);
  Store<uint64_t>(out + 32, h.payload_bytes);
  Store<uint64_t>(out + 40, h.payload_checksum);
  Store<uint64_t>(out + 48, XXH3_64bits(out, 48));
}

bool Decode(const char* in, Header* h) {
  if (std::memcmp(in, kMagic, sizeof kMagic) != 0) return false;
  if (LoadValue<uint32_t>(in + 8) != kVersion || LoadValue<uint32_t>(in + 12) != DiskTier::kHeaderBytes) return false;
  if (LoadValue<uint64_t>(in + 48) != XXH3_64bits(in, 48)) return false;
  h->fingerprint = LoadValue<uint64_t>(in + 16);
  h->hash = LoadValue<uint64_t>(in + 24);
  h->payload_bytes = LoadValue<uint64_t>(in + 32);
  h->payload_checksum = LoadValue<uint64_t>(in + 40);
  return true;
}

absl::Status ErrnoStatus(const std::string& what, int err) {
  return absl::Status(err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInternal,
                      absl::StrCat(what, ": ", std::strerror(err)));
}

// Reads the whole file at `path`. NOT_FOUND when missing.
absl::StatusOr<std::vector<char>> ReadAll(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(path, err);
  }
  std::vector<char> buf(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  buf.resize(got);
  return buf;
}

absl::Status WriteAll(int fd, const void* data, size_t length, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    const ssize_t n = ::write(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(path, errno);
    p += n;
    length -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Checks a whole file's bytes against `key` (when given) and returns its payload view.
bool Verify(const std::vector<char>& file, const BlockKey* key, Header* h) {
  if (file.size() < DiskTier::kHeaderBytes || !Decode(file.data(), h)) return false;
  if (key != nullptr && (h->fingerprint != key->fingerprint || h->hash != key->hash)) return false;
  if (h->payload_bytes != file.size() - DiskTier::kHeaderBytes) return false;
  return XXH3_64bits(file.data() + DiskTier::kHeaderBytes, h->payload_bytes) == h->payload_checksum;
}

}  // namespace

std::string DiskTier::PathOf(const BlockKey& key) const {
  const std::string hash = absl::StrFormat("%016x", key.hash);
  return absl::StrCat(dir_, "/", absl::StrFormat("%016x", key.fingerprint), "/", hash.substr(0, 2), "/", hash, ".kvb");
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& dir, int64_t capacity_bytes) {
  if (dir.empty()) return absl::InvalidArgumentError("disk tier: empty directory");
  if (capacity_bytes < 1) return absl::InvalidArgumentError("disk tier: capacity must be positive");
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "tmp", ec);
  if (ec) return absl::InternalError(absl::StrCat("disk tier: cannot create ", dir, ": ", ec.message()));
  std::unique_ptr<DiskTier> t(new DiskTier(dir, capacity_bytes));
  t->stats_.capacity_bytes = capacity_bytes;
  t->Load();
  t->writer_ = std::thread([raw = t.get()] { raw->WriterLoop(); });
  return t;
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void DiskTier::Load() {
  std::error_code ec;
  // Debris of writes a crash interrupted.
  for (const auto& e : fs::directory_iterator(fs::path(dir_) / "tmp", ec)) fs::remove(e.path(), ec);
  struct Found {
    BlockKey key;
    int64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  for (auto it = fs::recursive_directory_iterator(dir_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().extension() != ".kvb") continue;
    const std::string path = it->path().string();
    absl::StatusOr<std::vector<char>> file = ReadAll(path);
    Header h;
    const bool intact = file.ok() && Verify(*file, nullptr, &h);
    const BlockKey key{h.fingerprint, h.hash};
    if (!intact || PathOf(key) != path) {
      fs::remove(it->path(), ec);
      stats_.corrupt_dropped++;
      continue;
    }
    found.push_back({key, static_cast<int64_t>(file->size()), it->last_write_time(ec)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (const Found& f : found) {
    lru_.push_back(f.key);
    index_[f.key] = {f.bytes, std::prev(lru_.end())};
    used_ += f.bytes;
  }
  stats_.loaded = static_cast<int64_t>(found.size());
  while (used_ > capacity_ && !lru_.empty()) {
    const BlockKey oldest = lru_.front();
    Drop(oldest, /*corrupt=*/false);
    stats_.evictions++;
  }
}

void DiskTier::Drop(const BlockKey& key, bool corrupt) {
  // Called with mu_ held (or before the writer starts).
  auto it = index_.find(key);
  if (it != index_.end()) {
    used_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  if (corrupt) stats_.corrupt_dropped++;
  std::error_code ec;
  fs::remove(PathOf(key), ec);
}

bool DiskTier::Contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

absl::StatusOr<std::vector<char>> DiskTier::Read(const BlockKey& key, uint64_t* checksum) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError(absl::StrCat("block ", key.ToString(), " is not on disk"));
    lru_.splice(lru_.end(), lru_, it->second.lru);
  }
  absl::StatusOr<std::vector<char>> file = ReadAll(PathOf(key));
  Header h;
  if (!file.ok() || !Verify(*file, &key, &h)) {
    std::lock_guard<std::mutex> lock(mu_);
    // Gone meanwhile (evicted, replaced) is not corruption; anything else is.
    if (!index_.contains(key)) return absl::NotFoundError(absl::StrCat("block ", key.ToString(), " was evicted"));
    Drop(key, /*corrupt=*/true);
    return absl::DataLossError(absl::StrCat("block ", key.ToString(), " on disk did not verify: dropped"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reads++;
  }
  if (checksum != nullptr) *checksum = h.payload_checksum;
  file->erase(file->begin(), file->begin() + kHeaderBytes);
  return std::move(*file);
}

absl::Status DiskTier::Write(const BlockKey& key, const void* data, size_t length, uint64_t checksum) {
  const int64_t bytes = static_cast<int64_t>(length + kHeaderBytes);
  if (bytes > capacity_) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.write_failures++;
    return absl::ResourceExhaustedError(absl::StrCat("a block of ", bytes, " bytes exceeds the disk capacity"));
  }
  std::string tmp;
  {
    // Make room first (held as used_ while writing), forgetting a previous copy.
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      used_ -= it->second.bytes;
      lru_.erase(it->second.lru);
      index_.erase(it);
    }
    while (used_ + bytes > capacity_ && !lru_.empty()) {
      const BlockKey oldest = lru_.front();
      Drop(oldest, /*corrupt=*/false);
      stats_.evictions++;
    }
    used_ += bytes;
    tmp = absl::StrCat(dir_, "/tmp/", tmp_counter_++, ".", ::getpid());
  }
  char header[kHeaderBytes];
  Encode({key.fingerprint, key.hash, length, checksum}, header);
  const std::string path = PathOf(key);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  absl::Status st;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = ErrnoStatus(tmp, errno);
  } else {
    st = WriteAll(fd, header, kHeaderBytes, tmp);
    if (st.ok()) st = WriteAll(fd, data, length, tmp);
    if (::close(fd) != 0 && st.ok()) st = ErrnoStatus(tmp, errno);
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = ErrnoStatus(path, errno);
    if (!st.ok()) fs::remove(tmp, ec);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!st.ok()) {
    used_ -= bytes;
    stats_.write_failures++;
    return st;
  }
  if (auto it = index_.find(key); it != index_.end()) {  // written twice concurrently
    used_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  lru_.push_back(key);
  index_[key] = {bytes, std::prev(lru_.end())};
  stats_.writes++;
  return absl::OkStatus();
}

void DiskTier::WriteAsync(const BlockKey& key, const void* data, size_t length, uint64_t checksum,
                          std::function<void(absl::Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({key, data, length, checksum, std::move(done)});
  }
  cv_.notify_all();
}

size_t DiskTier::pending_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size() + (writing_ ? 1 : 0);
}

void DiskTier::WriterLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      writing_ = true;
    }
    absl::Status st = Write(job.key, job.data, job.length, job.checksum);
    if (job.done) job.done(st);
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
  }
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = stats_;
  s.blocks = static_cast<int64_t>(index_.size());
  s.bytes_used = used_;
  return s;
}

}  // namespace tandem::kvstore
