#pragma once
// Stale copy-views (internal). A view whose local data is a copy (making it needed communication)
// stops following its base: a later in-place write into the base leaves it with the old values,
// which the plain view would not have. Each copy-view therefore remembers the storage its values
// came from and how often DTensor ops had written into that storage when the copy was made; a
// read after a further write is refused, on every rank (every rank runs the same writes).
//
// Only storages some copy-view watches are counted: with none alive, a write costs one relaxed
// atomic load, and tensors that are not copy-views pay nothing at all.
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hyper_parallel {

/// Where a copy-view's values came from: the base's local storage (held weakly, so the address
/// cannot be reused while watched), its write count at the time of the copy, and the op that
/// made the copy. Shared by the copy-view, its shallow copies and the views made of it.
class CopySource {
 public:
  CopySource(const at::Tensor& base_local, std::string made_by);
  ~CopySource();
  CopySource(const CopySource&) = delete;
  CopySource& operator=(const CopySource&) = delete;

  /// How many DTensor writes reached the source storage since the copy was made (0: fresh).
  uint64_t writes_since() const;
  const std::string& made_by() const { return made_by_; }

 private:
  c10::weak_intrusive_ptr<c10::StorageImpl> storage_;
  uint64_t writes_at_copy_ = 0;
  std::string made_by_;
};

/// Throws c10::Error: `reader` (e.g. "hyper_parallel::dispatch: aten::add.Tensor") read `view` (its
/// argument name and spec), a copy-view made from `source` that a write has made stale.
[[noreturn]] void stale_copy_view_error(const CopySource& source, const std::string& qualified_reader, const std::string& view);

/// Records an in-place write (by a DTensor op) into the storage of `local`, a DTensor's local data.
void note_dtensor_write(const at::Tensor& local);

}  // namespace hyper_parallel
