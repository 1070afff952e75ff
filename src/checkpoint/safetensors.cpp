// safetensors: the header validated before use, tensors read as views over a read-only mapping.
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace hyper_parallel {

namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
// The safetensors names that every supported libtorch has a type for.
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

// The header of a real checkpoint is a few hundred KiB; anything far above is not a header.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kMaxTensorDims = 64;

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::safetensors_dtype_name: safetensors has no dtype for ", t);
}

void SafetensorsFile::fail(const std::string& why) const {
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::SafetensorsFile: safetensors file ", path_, ": ", why);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(std::string("cannot open it: ") + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(std::string("cannot stat it: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    size_ = st.st_size;
    if (size_ < 8) fail("it has " + std::to_string(size_) + " bytes, fewer than the 8-byte header length (truncated)");
    uint8_t len_bytes[8];
    if (::pread(fd_, len_bytes, 8, 0) != 8) fail(std::string("cannot read it: ") + std::strerror(errno));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > kMaxHeaderBytes) fail("its header length is " + std::to_string(n) + " bytes (not a safetensors file, or corrupt)");
    if (n > static_cast<uint64_t>(size_ - 8))
      fail("its header length is " + std::to_string(n) + " bytes but the file has only " + std::to_string(size_ - 8) +
           " after the length (truncated)");
    data_start_ = 8 + static_cast<int64_t>(n);
    std::string header(n, '\0');
    if (n && ::pread(fd_, header.data(), n, 8) != static_cast<ssize_t>(n)) fail(std::string("cannot read its header: ") + std::strerror(errno));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header);
    } catch (const nlohmann::json::parse_error& e) {
      fail(std::string("its header is not valid JSON (") + e.what() + ")");
    }
    if (!j.is_object()) fail("its header is not a JSON object");
    const int64_t data_bytes = size_ - data_start_;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const auto& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail("its __metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail("__metadata__ entry '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& why) { fail("tensor '" + name + "': " + why); };
      if (!v.is_object()) bad("its entry is not an object");
      for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!v.contains(key)) bad(std::string("its entry lacks '") + key + "'");
      SafetensorsTensorInfo t;
      t.name = name;
      if (!v["dtype"].is_string()) bad("its dtype is not a string");
      t.dtype_name = v["dtype"].get<std::string>();
      const auto* d = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& x) { return t.dtype_name == x.name; });
      if (d == std::end(kDtypes)) bad("dtype '" + t.dtype_name + "' is not supported (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
      t.dtype = d->type;
      const auto& shape = v["shape"];
      if (!shape.is_array() || shape.size() > kMaxTensorDims) bad("its shape is not an array of at most 64 sizes");
      uint64_t numel = 1;
      bool too_big = false;  // more elements than the file has bytes: no multiplication overflows
      for (const auto& s : shape) {
        if (!s.is_number_unsigned()) bad("its shape " + shape.dump() + " holds something other than non-negative integers");
        const uint64_t e = s.get<uint64_t>();
        if (e > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad("its shape " + shape.dump() + " is too large");
        if (e == 0) numel = 0, too_big = false;
        else if (!too_big && numel != 0 && numel > static_cast<uint64_t>(data_bytes) / e) too_big = true;
        else if (!too_big) numel *= e;
        t.shape.push_back(static_cast<int64_t>(e));
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        bad("its data_offsets " + off.dump() + " are not two non-negative integers");
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e) bad("its data_offsets " + off.dump() + " end before they begin");
      if (e > static_cast<uint64_t>(data_bytes))
        bad("its data_offsets " + off.dump() + " end past the data buffer's " + std::to_string(data_bytes) + " bytes (truncated)");
      const uint64_t want = too_big ? 0 : numel * c10::elementSize(t.dtype);
      if (too_big || e - b != want)
        bad("its data_offsets " + off.dump() + " span " + std::to_string(e - b) + " bytes, but shape " + shape.dump() + " of " +
            t.dtype_name + " needs " + (too_big ? std::string("more than the file holds") : std::to_string(want)));
      t.begin = static_cast<int64_t>(b);
      t.end = static_cast<int64_t>(e);
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // The buffer is tiled exactly: each tensor starts where the previous one ended and the last ends
    // at the file's end. Anything else is an overlap (two tensors sharing bytes), a hole, or a
    // truncated or padded file.
    int64_t at = 0;
    for (const auto& t : tensors_) {
      if (t.begin < at) fail("tensor '" + t.name + "' overlaps the tensor before it (bytes " + std::to_string(t.begin) + " < " + std::to_string(at) + ")");
      if (t.begin > at) fail("bytes " + std::to_string(at) + ".." + std::to_string(t.begin) + " before tensor '" + t.name + "' belong to no tensor");
      at = t.end;
    }
    if (at != data_bytes)
      fail("its tensors end at byte " + std::to_string(at) + " of the data buffer, but the file holds " + std::to_string(data_bytes) +
           " bytes after the header");
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
    if (size_ > 0) {
      void* m = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
      if (m == MAP_FAILED) fail(std::string("cannot map it: ") + std::strerror(errno));
      map_ = static_cast<const uint8_t*>(m);
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

// The box read with pread straight into `out` (host memory, contiguous, the file's dtype), in its
// longest contiguous runs: no page of the mapping is touched, and the kernel copies from the
// page cache into the destination once (a mapping costs a fault per page on top).
void SafetensorsFile::pread_box(const SafetensorsTensorInfo& t, at::IntArrayRef start, at::Tensor& out) const {
  const std::vector<int64_t>& shape = t.shape;
  const size_t n = shape.size();
  const int64_t es = static_cast<int64_t>(c10::elementSize(t.dtype));
  // Dims k.. are whole in the box: a run covers dim k-1's extent times their product.
  size_t k = n;
  int64_t run = 1;
  while (k > 0 && out.size(static_cast<int64_t>(k - 1)) == shape[k - 1]) run *= shape[--k];
  if (k > 0) run *= out.size(static_cast<int64_t>(--k));
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  std::vector<int64_t> idx(k, 0);
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t base = data_start_ + t.begin;
  while (true) {
    int64_t elem = n == 0 ? 0 : start[k] * stride[k];
    for (size_t d = 0; d < k; ++d) elem += (start[d] + idx[d]) * stride[d];
    size_t left = static_cast<size_t>(run * es);
    int64_t at = base + elem * es;
    while (left > 0) {
      const ssize_t got = ::pread(fd_, dst, left, at);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail("cannot read tensor '" + t.name + "' (" + (got < 0 ? std::strerror(errno) : "end of file") + ")");
      dst += got;
      at += got;
      left -= static_cast<size_t>(got);
    }
    size_t d = k;
    while (d > 0 && ++idx[d - 1] == out.size(static_cast<int64_t>(d - 1))) idx[--d] = 0;
    if (d == 0) break;
  }
}

// The mapping's pages of [p, p + n) are no longer needed by this process: a model loaded from a
// file larger than memory keeps only the bytes it is copying resident (the page cache keeps the
// file for the next reader). Advisory: a failure changes nothing but memory use.
void SafetensorsFile::drop_pages(const uint8_t* p, int64_t n) const {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo* t = find(name);
  if (!t) fail("it holds no tensor '" + name + "'");
  const uint8_t* p = map_ + data_start_ + t->begin;
  const auto opts = at::TensorOptions().dtype(t->dtype);
  if (reinterpret_cast<uintptr_t>(p) % c10::elementSize(t->dtype) == 0)
    return at::from_blob(const_cast<uint8_t*>(p), t->shape, opts);
  // The format does not require aligned offsets; kernels expect aligned elements.
  at::Tensor copy = at::empty(t->shape, opts);
  std::memcpy(copy.data_ptr(), p, static_cast<size_t>(t->end - t->begin));
  return copy;
}

int64_t SafetensorsFile::read_box(const std::string& name, at::IntArrayRef start, at::Tensor& out) const {
  const SafetensorsTensorInfo* t = find(name);
  if (!t) fail("it holds no tensor '" + name + "'");
  HP_CHECK_T(c10::ValueError, start.size() == t->shape.size() && out.dim() == static_cast<int64_t>(t->shape.size()),
             "hyper_parallel::SafetensorsFile::read_box: safetensors file ", path_, ": tensor '", name, "' has ", t->shape.size(), " dimensions; the box asked for has ",
             out.dim());
  for (size_t d = 0; d < start.size(); ++d)
    HP_CHECK_T(c10::ValueError, start[d] >= 0 && start[d] + out.size(static_cast<int64_t>(d)) <= t->shape[d], "hyper_parallel::SafetensorsFile::read_box: safetensors file ",
               path_, ": the box at ", start, " of size ", out.sizes(), " lies outside tensor '", name, "' of shape ",
               c10::IntArrayRef(t->shape));
  const auto opts = at::TensorOptions().dtype(t->dtype);
  const int64_t es = static_cast<int64_t>(c10::elementSize(t->dtype));
  // The box's bytes in the file run from its first element to its last: map only that span.
  std::vector<int64_t> strides(t->shape.size());
  int64_t s = 1;
  for (size_t d = strides.size(); d-- > 0;) {
    strides[d] = s;
    s *= t->shape[d];
  }
  if (out.numel() == 0) return 0;
  if (out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == t->dtype) {
    pread_box(*t, start, out);
    return out.numel() * es;
  }
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < strides.size(); ++d) {
    first += start[d] * strides[d];
    last += (start[d] + out.size(static_cast<int64_t>(d)) - 1) * strides[d];
  }
  const uint8_t* p = map_ + data_start_ + t->begin + first * es;
  const int64_t span = (last - first + 1) * es;
  at::Tensor src;
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(es) == 0) {
    src = at::from_blob(const_cast<uint8_t*>(p), out.sizes(), strides, opts);
  } else {
    at::Tensor aligned = at::empty({span / es}, opts);
    std::memcpy(aligned.data_ptr(), p, static_cast<size_t>(span));
    src = aligned.as_strided(out.sizes(), strides);
  }
  out.copy_(src);
  drop_pages(p, span);
  // Rows of a box that spans several rows are separated by bytes it does not need; count what it
  // uses, which is what the kernel reads whole pages of.
  return out.numel() * es;
}

}  // namespace hyper_parallel
