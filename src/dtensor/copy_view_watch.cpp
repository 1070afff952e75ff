#include "copy_view_watch.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace hyper_parallel {
namespace {

struct Entry {
  uint64_t writes = 0;
  int64_t watchers = 0;
};

// Process-wide: a base may be written on autograd's threads, and copy-views live across threads.
std::mutex g_mutex;
std::unordered_map<const c10::StorageImpl*, Entry>& watched() {
  static auto* m = new std::unordered_map<const c10::StorageImpl*, Entry>();  // outlives every tensor
  return *m;
}
std::atomic<int64_t> g_watched{0};

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return t.storage().unsafeGetStorageImpl();
}

c10::weak_intrusive_ptr<c10::StorageImpl> weak_storage_of(const at::Tensor& t) {
  if (storage_of(t) == nullptr) return c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>());
  return t.storage().getWeakStorageImpl();
}

}  // namespace

CopySource::CopySource(const at::Tensor& base_local, std::string made_by)
    : storage_(weak_storage_of(base_local)), made_by_(std::move(made_by)) {
  const c10::StorageImpl* s = storage_._unsafe_get_target();
  if (s == nullptr) return;  // nothing can write a storage that does not exist
  std::lock_guard<std::mutex> lock(g_mutex);
  Entry& e = watched()[s];
  if (e.watchers++ == 0) g_watched.fetch_add(1, std::memory_order_relaxed);
  writes_at_copy_ = e.writes;
}

CopySource::~CopySource() {
  const c10::StorageImpl* s = storage_._unsafe_get_target();
  if (s == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = watched().find(s);
  if (it == watched().end()) return;
  if (--it->second.watchers == 0) {
    watched().erase(it);
    g_watched.fetch_sub(1, std::memory_order_relaxed);
  }
}

uint64_t CopySource::writes_since() const {
  const c10::StorageImpl* s = storage_._unsafe_get_target();
  if (s == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = watched().find(s);
  return it == watched().end() ? 0 : it->second.writes - writes_at_copy_;
}

void stale_copy_view_error(const CopySource& source, const std::string& qualified_reader, const std::string& view) {
  TORCH_CHECK(false, qualified_reader, " reads ", view, ", a view whose values are a copy: making it with ", source.made_by(),
              " needed communication, so it does not share data with its base. Its base has been written in place ",
              source.writes_since(), " time(s) since, so it holds stale values where the plain view would follow "
              "the base. Make the view again after writing the base (or clone() it before the write to keep the old "
              "values)");
}

void note_dtensor_write(const at::Tensor& local) {
  if (g_watched.load(std::memory_order_relaxed) == 0) return;
  const c10::StorageImpl* s = storage_of(local);
  if (s == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = watched().find(s);
  if (it != watched().end()) ++it->second.writes;
}

}  // namespace hyper_parallel
