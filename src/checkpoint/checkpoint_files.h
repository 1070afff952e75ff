#pragma once
// File primitives for crash-safe checkpoints: checked writes with fsync, atomic replace, CRC-32,
// and a bounds-checked reader for the line-based metadata files. Internal to the library.
#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel {
namespace checkpoint_files {

/// CRC-32 (IEEE, as zlib's crc32) of `n` bytes, continuing from `crc`.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

/// Throws c10::Error "checkpoint: cannot <what> <path>: <strerror(err)>".
[[noreturn]] void os_error(const char* what, const std::string& path, int err);

/// Writes `bytes` to `path` (created or truncated), checks every write and fsyncs the file.
/// Throws c10::Error naming the path and the OS error (ENOSPC, EFBIG, EIO, ...).
void write_file(const std::string& path, const std::string& bytes);
/// A file written in pieces (e.g. an archive streamed out), every write checked, its size and CRC
/// kept; finish() fsyncs and closes it. Throws c10::Error naming the path and the OS error.
class FileWriter {
 public:
  explicit FileWriter(std::string path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const void* data, size_t n);
  void finish();
  int64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  uint32_t crc_ = 0;
};
/// A file mapped read-only (a checkpoint's shards read without a copy into memory first).
/// c10::ValueError "<what>: ..." naming it when it is missing or cannot be mapped.
class MappedFile {
 public:
  MappedFile(const std::string& path, const char* what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};
/// Writes `bytes` to `path + ".tmp"`, fsyncs it, renames it over `path` and fsyncs the directory:
/// readers see the old file or the new one, never a mix.
void replace_file(const std::string& path, const std::string& bytes);
/// fsyncs a directory, so the entries created in it survive a crash.
void sync_dir(const std::string& dir);
/// The whole file; c10::ValueError "<what>: ..." naming it when it is missing or larger than `max_bytes`.
std::string read_file(const std::string& path, int64_t max_bytes, const char* what = "load_sharded");
int64_t file_size(const std::string& path);
/// Removes a directory tree (best effort; used for failed and pruned generations).
void remove_tree(const std::string& path);

/// Throws c10::ValueError "checkpoint file <path> is truncated or corrupt: <why>" (the load that
/// reads it prefixes its own name when it reports).
[[noreturn]] void corrupt_file(const std::string& path, const std::string& why);

/// Appends the line "crc <hex>" covering everything before it.
std::string seal(std::string text);

/// A parsed metadata file: its lines split on spaces, after its crc line was verified. Every
/// accessor checks bounds and numbers and throws c10::ValueError naming the file and the key.
class Lines {
 public:
  Lines(std::string path, const std::string& text, const std::string& magic);
  size_t size() const { return lines_.size(); }
  const std::vector<std::string>& line(size_t i) const { return lines_[i]; }
  /// Token `k` of line `i`, which must exist.
  const std::string& token(size_t i, size_t k, const char* key) const;
  int64_t integer(size_t i, size_t k, const char* key, int64_t lo, int64_t hi) const;
  /// A comma-separated list of integers in [lo, hi] ("-" is empty), at most `max_len` long.
  std::vector<int64_t> integers(size_t i, size_t k, const char* key, int64_t lo, int64_t hi, size_t max_len) const;
  /// The line whose first token is `key` (exactly one).
  size_t find(const char* key) const;
  [[noreturn]] void fail(const std::string& why) const;

 private:
  std::string path_;
  std::vector<std::vector<std::string>> lines_;
};

}  // namespace checkpoint_files
}  // namespace hyper_parallel
