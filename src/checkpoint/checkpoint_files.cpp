#include "checkpoint_files.h"

#include <hyper_parallel/runtime/errors.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hyper_parallel {
namespace checkpoint_files {
namespace {

// Slicing by 8: eight bytes per step through eight tables (t[k][b]: byte b followed by k zero
// bytes), about five times the byte-at-a-time loop; the same CRC.
struct CrcTable {
  uint32_t t[8][256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
};

uint32_t load32_le(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace

[[noreturn]] void os_error(const char* what, const std::string& path, int err) {
  TORCH_CHECK(false, "hyper_parallel::checkpoint: cannot ", what, " ", path, ": ", std::strerror(err));
}


uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const CrcTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  const auto& t = table.t;
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t one = load32_le(p) ^ crc, two = load32_le(p + 4);
    crc = t[7][one & 0xFFu] ^ t[6][(one >> 8) & 0xFFu] ^ t[5][(one >> 16) & 0xFFu] ^ t[4][one >> 24] ^ t[3][two & 0xFFu] ^
          t[2][(two >> 8) & 0xFFu] ^ t[1][(two >> 16) & 0xFFu] ^ t[0][two >> 24];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

FileWriter::FileWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) os_error("create", path_, errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  crc_ = crc32(data, n, crc_);
  size_ += static_cast<int64_t>(n);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) os_error("write", path_, w < 0 ? errno : ENOSPC);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void FileWriter::finish() {
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    os_error("fsync", path_, err);
  }
  if (::close(fd) != 0) os_error("close", path_, errno);
}

void write_file(const std::string& path, const std::string& bytes) {
  FileWriter f(path);
  f.write(bytes.data(), bytes.size());
  f.finish();
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) os_error("open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) os_error("fsync directory", dir, err);
}

void replace_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  write_file(tmp, bytes);
  if (::rename(tmp.c_str(), path.c_str()) != 0) os_error("rename into", path, errno);
  sync_dir(std::filesystem::path(path).parent_path().string());
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string read_file(const std::string& path, int64_t max_bytes, const char* what) {
  const int64_t size = file_size(path);
  HP_CHECK_T(c10::ValueError, size >= 0, "hyper_parallel::", what, ": ", path, " is missing");
  HP_CHECK_T(c10::ValueError, size <= max_bytes, "hyper_parallel::", what, ": ", path, " has ", size,
             " bytes, more than a file of its kind can (", max_bytes, "): corrupt");
  std::ifstream in(path, std::ios::binary);
  HP_CHECK_T(c10::ValueError, in.good(), "hyper_parallel::", what, ": cannot read ", path);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  HP_CHECK_T(c10::ValueError, in.gcount() == size, "hyper_parallel::", what, ": ", path, " changed while it was read");
  return bytes;
}

MappedFile::MappedFile(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK_T(c10::ValueError, fd >= 0, "hyper_parallel::", what, ": cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", what, ": cannot stat ", path, ": ", std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    HP_CHECK_T(c10::ValueError, m != MAP_FAILED, "hyper_parallel::", what, ": cannot map ", path, ": ", std::strerror(err));
    data_ = static_cast<const char*>(m);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string seal(std::string text) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc %08x\n", crc32(text.data(), text.size()));
  return text + buf;
}

Lines::Lines(std::string path, const std::string& text, const std::string& magic) : path_(std::move(path)) {
  // The crc line seals the file: any flipped or missing byte is refused before any value is used.
  const size_t last = text.rfind("crc ", text.size() >= 4 ? text.size() - 4 : 0);
  if (last == std::string::npos || (last != 0 && text[last - 1] != '\n') || text.empty() || text.back() != '\n')
    fail("it has no crc line (truncated?)");
  const std::string body = text.substr(0, last);
  const std::string stored = text.substr(last + 4, text.size() - last - 5);
  char expect[16];
  std::snprintf(expect, sizeof expect, "%08x", crc32(body.data(), body.size()));
  if (stored != expect) fail("its crc is " + stored + " but its contents hash to " + expect + " (corrupt)");
  std::istringstream in(body);
  std::string l;
  while (std::getline(in, l)) {
    std::vector<std::string> toks;
    std::istringstream ls(l);
    std::string t;
    while (ls >> t) toks.push_back(t);
    lines_.push_back(std::move(toks));
  }
  if (lines_.empty() || lines_[0].empty()) fail("it is empty");
  std::string first;
  for (size_t k = 0; k < lines_[0].size(); ++k) first += (k ? " " : "") + lines_[0][k];
  if (first != magic) fail("its header is '" + first + "', expected '" + magic + "'");
}

void corrupt_file(const std::string& path, const std::string& why) {
  throw c10::ValueError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        c10::str("checkpoint file ", path, " is truncated or corrupt: ", why));
}

void Lines::fail(const std::string& why) const { corrupt_file(path_, why); }

const std::string& Lines::token(size_t i, size_t k, const char* key) const {
  if (i >= lines_.size() || k >= lines_[i].size())
    fail(std::string("line ") + std::to_string(i + 1) + " ('" + key + "') has too few fields");
  return lines_[i][k];
}

int64_t Lines::integer(size_t i, size_t k, const char* key, int64_t lo, int64_t hi) const {
  const std::string& t = token(i, k, key);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || errno != 0 || end == nullptr || *end != '\0' || v < lo || v > hi)
    fail(std::string("'") + key + "' is '" + t + "', not an integer in [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "]");
  return v;
}

std::vector<int64_t> Lines::integers(size_t i, size_t k, const char* key, int64_t lo, int64_t hi,
                                     size_t max_len) const {
  const std::string& t = token(i, k, key);
  std::vector<int64_t> out;
  if (t == "-") return out;
  size_t start = 0;
  while (true) {
    const size_t comma = t.find(',', start);
    const std::string item = t.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno != 0 || *end != '\0' || v < lo || v > hi || out.size() >= max_len)
      fail(std::string("'") + key + "' is '" + t + "', not a list of at most " + std::to_string(max_len) +
           " integers in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

size_t Lines::find(const char* key) const {
  size_t found = lines_.size();
  for (size_t i = 1; i < lines_.size(); ++i)
    if (!lines_[i].empty() && lines_[i][0] == key) {
      if (found != lines_.size()) fail(std::string("'") + key + "' appears twice");
      found = i;
    }
  if (found == lines_.size()) fail(std::string("it has no '") + key + "' line");
  return found;
}

}  // namespace checkpoint_files
}  // namespace hyper_parallel
