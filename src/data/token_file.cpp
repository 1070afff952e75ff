// Token files (token_file.h): the writer's checked, fsynced, renamed writes and the reader's
// header checks against the mapped file (mapped as checkpoint files are).
#include <hyper_parallel/data/token_file.h>

#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "../checkpoint/checkpoint_files.h"

#include <unistd.h>

namespace hyper_parallel {
namespace data {
namespace {

constexpr char kMagic[8] = {'H', 'P', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr size_t kHeaderBytes = 64;

void put64(uint8_t* p, uint64_t v) {
  for (int b = 0; b < 8; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

std::string header_of(const TokenFileInfo& i) {
  uint8_t h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  put64(h + 8, static_cast<uint64_t>(i.bytes_per_token));
  put64(h + 16, static_cast<uint64_t>(i.vocab_size));
  put64(h + 24, static_cast<uint64_t>(i.num_tokens));
  put64(h + 32, static_cast<uint64_t>(i.eos_id));
  put64(h + 40, static_cast<uint64_t>(i.num_documents));
  put64(h + 48, static_cast<uint64_t>(i.max_token_id));
  return std::string(reinterpret_cast<const char*>(h), kHeaderBytes);
}

}  // namespace

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size, int64_t eos_id) : path_(path), tmp_(path + ".tmp") {
  HP_CHECK_T(c10::ValueError, vocab_size >= 1 && vocab_size <= (int64_t{1} << 32), "hyper_parallel::data::TokenFileWriter: a vocabulary of ",
             vocab_size, " ids cannot be stored (1 .. 2^32)");
  HP_CHECK_T(c10::ValueError, eos_id >= 0 && eos_id < vocab_size, "hyper_parallel::data::TokenFileWriter: the EOS id ", eos_id,
             " is outside the vocabulary of ", vocab_size);
  info_.bytes_per_token = vocab_size <= 65535 ? 2 : 4;  // uint32 once the vocabulary exceeds 65,535
  info_.vocab_size = vocab_size;
  info_.eos_id = eos_id;
  f_ = std::fopen(tmp_.c_str(), "wb");
  HP_CHECK_T(c10::ValueError, f_ != nullptr, "hyper_parallel::data::TokenFileWriter: cannot create ", tmp_, ": ", std::strerror(errno));
  const std::string h = header_of(info_);  // rewritten with the counts by close()
  write(h.data(), h.size());
}

TokenFileWriter::~TokenFileWriter() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void TokenFileWriter::write(const void* data, size_t n) {
  if (std::fwrite(data, 1, n, f_) != n) {
    const int err = errno;
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::data::TokenFileWriter: writing ", tmp_, " failed: ", std::strerror(err));
  }
}

void TokenFileWriter::append_document(const std::vector<int64_t>& ids) {
  HP_CHECK_T(c10::ValueError, f_ != nullptr, "hyper_parallel::data::TokenFileWriter::append_document: the writer of ", path_, " is closed");
  buffer_.clear();
  buffer_.reserve((ids.size() + 1) * static_cast<size_t>(info_.bytes_per_token));
  auto put = [&](int64_t id) {
    HP_CHECK_T(c10::ValueError, id >= 0 && id < info_.vocab_size, "hyper_parallel::data::TokenFileWriter::append_document: token id ", id,
               " is outside the vocabulary of ", info_.vocab_size);
    info_.max_token_id = std::max(info_.max_token_id, id);
    for (int64_t b = 0; b < info_.bytes_per_token; ++b) buffer_.push_back(static_cast<uint8_t>(static_cast<uint64_t>(id) >> (8 * b)));
  };
  for (int64_t id : ids) put(id);
  put(info_.eos_id);
  write(buffer_.data(), buffer_.size());
  info_.num_tokens += static_cast<int64_t>(ids.size()) + 1;
  info_.num_documents += 1;
}

void TokenFileWriter::close() {
  HP_CHECK_T(c10::ValueError, f_ != nullptr, "hyper_parallel::data::TokenFileWriter::close: the writer of ", path_, " is closed");
  const std::string h = header_of(info_);
  const bool ok = std::fflush(f_) == 0 && std::fseek(f_, 0, SEEK_SET) == 0 && std::fwrite(h.data(), 1, h.size(), f_) == h.size() &&
                  std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    std::remove(tmp_.c_str());
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::data::TokenFileWriter::close: writing ", tmp_, " failed: ", std::strerror(err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  HP_CHECK_T(c10::ValueError, !ec, "hyper_parallel::data::TokenFileWriter::close: cannot rename ", tmp_, " to ", path_, ": ", ec.message());
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const auto file = std::make_shared<checkpoint_files::MappedFile>(path, "data::TokenFile");
  const size_t size = file->size();
  HP_CHECK_T(c10::ValueError, size >= kHeaderBytes, "hyper_parallel::data::TokenFile: ", path, " has ", size,
             " bytes, fewer than a token file's header (truncated, or not a token file)");
  mapping_ = file;
  map_ = reinterpret_cast<const uint8_t*>(file->data());
  auto refuse = [&](const std::string& why) { HP_CHECK_T(c10::ValueError, false, "hyper_parallel::data::TokenFile: ", path, " ", why); };
  if (std::memcmp(map_, kMagic, 8) != 0) refuse("is not a token file (no HPTOKEN1 header; make one with hp_tokenize)");
  info_.bytes_per_token = static_cast<int64_t>(get64(map_ + 8));
  info_.vocab_size = static_cast<int64_t>(get64(map_ + 16));
  info_.num_tokens = static_cast<int64_t>(get64(map_ + 24));
  info_.eos_id = static_cast<int64_t>(get64(map_ + 32));
  info_.num_documents = static_cast<int64_t>(get64(map_ + 40));
  info_.max_token_id = static_cast<int64_t>(get64(map_ + 48));
  if (info_.bytes_per_token != 2 && info_.bytes_per_token != 4)
    refuse("stores " + std::to_string(info_.bytes_per_token) + " bytes per token; token files hold uint16 (2) or uint32 (4)");
  if (info_.vocab_size < 1 || info_.vocab_size > (int64_t{1} << 32) || (info_.bytes_per_token == 2 && info_.vocab_size > 65536))
    refuse("has a vocabulary of " + std::to_string(info_.vocab_size) + " that " + std::to_string(info_.bytes_per_token) +
           "-byte tokens cannot hold");
  const uint64_t want = kHeaderBytes + static_cast<uint64_t>(info_.num_tokens) * static_cast<uint64_t>(info_.bytes_per_token);
  if (info_.num_tokens < 0 || want != size)
    refuse("has " + std::to_string(size) + " bytes where its header's " + std::to_string(info_.num_tokens) + " tokens need " +
           std::to_string(want) + " (truncated or corrupt)");
  if (info_.eos_id < 0 || info_.eos_id >= info_.vocab_size || info_.max_token_id >= info_.vocab_size)
    refuse("has ids outside its own vocabulary of " + std::to_string(info_.vocab_size) + " (corrupt header)");
}

at::Tensor TokenFile::tokens(int64_t start, int64_t n) const {
  HP_CHECK_T(c10::ValueError, start >= 0 && n >= 0 && start + n <= info_.num_tokens, "hyper_parallel::data::TokenFile::tokens: [", start,
             ", ", start + n, ") is outside the ", info_.num_tokens, " tokens of ", path_);
  at::Tensor out = at::empty({n}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  const uint8_t* p = map_ + kHeaderBytes + static_cast<size_t>(start * info_.bytes_per_token);
  if (info_.bytes_per_token == 2) {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int64_t>(p[2 * i] | (p[2 * i + 1] << 8));
  } else {
    for (int64_t i = 0; i < n; ++i)
      o[i] = static_cast<int64_t>(static_cast<uint32_t>(p[4 * i]) | (static_cast<uint32_t>(p[4 * i + 1]) << 8) |
                                  (static_cast<uint32_t>(p[4 * i + 2]) << 16) | (static_cast<uint32_t>(p[4 * i + 3]) << 24));
  }
  // The header vouches for every id (its largest is checked at opening), but the body can still
  // be damaged: an id the embedding cannot look up is named here, with its place in the file,
  // rather than as an index error deep in a forward.
  int64_t largest = -1;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, o[i]);
  if (largest >= info_.vocab_size || (info_.max_token_id >= 0 && largest > info_.max_token_id)) {
    int64_t i = 0;
    while (o[i] != largest) ++i;
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::data::TokenFile::tokens: ", path_, " holds token id ", largest,
               " at position ", start + i, " (byte offset ", kHeaderBytes + static_cast<uint64_t>((start + i) * info_.bytes_per_token),
               "), ", largest >= info_.vocab_size ? "outside its vocabulary of " + std::to_string(info_.vocab_size)
                                                  : "beyond the largest id its header records (" + std::to_string(info_.max_token_id) + ")",
               ": the file is damaged; tokenize the corpus again (hp_tokenize)");
  }
  return out;
}

}  // namespace data
}  // namespace hyper_parallel
