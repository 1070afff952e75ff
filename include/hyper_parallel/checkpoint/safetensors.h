#pragma once
// Reading Hugging Face safetensors files: memory-mapped, the header validated in full before any
// tensor is touched. The format: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then
// the data buffer that the offsets index.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel {

/// One tensor of a safetensors file, as its header declares it.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;  // the file's spelling: "F32", "BF16", ...
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

/// A safetensors file opened read-only and memory-mapped. Construction validates the header: the
/// length, the JSON, every dtype, shape and offset pair (inside the file, the size that the shape
/// and dtype imply, no overlaps, no holes, the buffer's declared end = the file's end). A bad file
/// raises c10::ValueError naming the file and the tensor. Nothing is read beyond the header until
/// a tensor's bytes are asked for.
/// e.g. `hp::SafetensorsFile f("model.safetensors"); at::Tensor w = f.tensor("lm_head.weight");`
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// The tensors in the order of their data offsets.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const SafetensorsTensorInfo* find(const std::string& name) const;
  /// The header's "__metadata__" (string to string; empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A read-only CPU view of the whole tensor over the mapping (no copy; valid while this file
  /// lives). Reading it faults in only the pages touched: narrow it first to read a slice.
  at::Tensor tensor(const std::string& name) const;
  /// Copies the box [start, start + out.sizes()) of tensor `name` into `out` (any device and
  /// dtype; cast element by element) and returns the number of file bytes it read. A contiguous
  /// host tensor of the file's dtype is filled with pread; otherwise the box is copied from the
  /// mapping, whose pages leave this process's resident set afterwards (the page cache keeps them).
  int64_t read_box(const std::string& name, at::IntArrayRef start, at::Tensor& out) const;

 private:
  [[noreturn]] void fail(const std::string& why) const;
  void drop_pages(const uint8_t* p, int64_t n) const;
  void pread_box(const SafetensorsTensorInfo& t, at::IntArrayRef start, at::Tensor& out) const;
  std::string path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  int64_t size_ = 0, data_start_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

/// The safetensors dtype name of `t` ("F32", "BF16", ...); c10::ValueError for types the format
/// lacks (complex, quantized).
std::string safetensors_dtype_name(at::ScalarType t);

}  // namespace hyper_parallel
