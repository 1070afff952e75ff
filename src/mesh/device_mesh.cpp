#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace hyper_parallel {

struct DeviceMesh::Impl {
  std::string device_type;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
  std::vector<int64_t> ranks;  // row-major
  c10::optional<std::vector<int64_t>> coordinate;
  std::vector<Group> groups;  // one per dim; undefined when this rank is not in the mesh
  uint64_t seed = 0;
  std::shared_ptr<const Impl> root;  // the mesh this one was sliced from, if any
  int64_t root_dim = -1;             // a 1-D slice's dimension in root
  std::vector<int64_t> root_dims;    // a slice's dimensions in root
  // A root made by unflattening dimension refined_dim of the root `refined` into refined_count.
  std::shared_ptr<const Impl> refined;
  int64_t refined_dim = -1, refined_count = 0;
};

namespace {
const DeviceMesh::Impl& get(const std::shared_ptr<const DeviceMesh::Impl>& p) {
  TORCH_CHECK(p != nullptr, "hyper_parallel::DeviceMesh: use of an undefined DeviceMesh");
  return *p;
}

int64_t wrap_mesh_dim(int64_t dim, int64_t ndim) { return wrap_dim(dim, ndim, "DeviceMesh", "a mesh"); }

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    st[static_cast<size_t>(i)] = st[static_cast<size_t>(i + 1)] * shape[static_cast<size_t>(i + 1)];
  return st;
}

std::string names_of(const std::vector<std::string>& names) {
  std::string s = "(";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s + (names.size() == 1 ? ",)" : ")");
}

// This rank's coordinate in `m` (shape and row-major ranks set; `me`: its index in m.ranks) and
// the process group of its peers along every dimension. Collective over the mesh's ranks.
void place_and_group(DeviceMesh::Impl& m, int64_t me) {
  const auto st = strides_of(m.shape);
  std::vector<int64_t> coord(m.shape.size());
  for (size_t d = 0; d < m.shape.size(); ++d) coord[d] = (me / st[d]) % m.shape[d];
  m.coordinate = coord;
  // Groups in dimension order on every rank, so members of a group always meet.
  for (size_t d = 0; d < m.shape.size(); ++d) {
    const int64_t base = me - coord[d] * st[d];
    std::vector<int64_t> peers;
    for (int64_t i = 0; i < m.shape[d]; ++i) peers.push_back(m.ranks[static_cast<size_t>(base + i * st[d])]);
    m.groups.push_back(new_group(peers));
  }
}

thread_local std::vector<DeviceMesh> t_mesh_stack;
}  // namespace

const std::string& DeviceMesh::device_type() const { return get(impl_).device_type; }
int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(get(impl_).shape.size()); }
int64_t DeviceMesh::size(int64_t dim) const {
  return get(impl_).shape[static_cast<size_t>(wrap_mesh_dim(dim, ndim()))];
}
int64_t DeviceMesh::size() const { return static_cast<int64_t>(get(impl_).ranks.size()); }
std::vector<int64_t> DeviceMesh::shape() const { return get(impl_).shape; }
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return get(impl_).dim_names; }
const std::vector<int64_t>& DeviceMesh::ranks() const { return get(impl_).ranks; }
c10::optional<std::vector<int64_t>> DeviceMesh::get_coordinate() const { return get(impl_).coordinate; }
uint64_t DeviceMesh::shared_seed() const { return get(impl_).seed; }

int64_t DeviceMesh::get_local_rank(int64_t dim) const {
  const auto& m = get(impl_);
  TORCH_CHECK(m.coordinate.has_value(), "hyper_parallel::DeviceMesh: this rank is not part of ", to_string());
  return (*m.coordinate)[static_cast<size_t>(wrap_mesh_dim(dim, ndim()))];
}

const Group& DeviceMesh::get_group(int64_t dim) const {
  const auto& m = get(impl_);
  TORCH_CHECK(m.coordinate.has_value(), "hyper_parallel::DeviceMesh: this rank is not part of ", to_string());
  return m.groups[static_cast<size_t>(wrap_mesh_dim(dim, ndim()))];
}

int64_t DeviceMesh::dim_index(const std::string& dim_name) const {
  const auto& m = get(impl_);
  auto it = std::find(m.dim_names.begin(), m.dim_names.end(), dim_name);
  HP_CHECK_T(c10::IndexError, it != m.dim_names.end(), "hyper_parallel::DeviceMesh: no mesh dimension named '",
             dim_name, "'; the mesh has mesh_dim_names=", names_of(m.dim_names));
  return static_cast<int64_t>(it - m.dim_names.begin());
}

const Group& DeviceMesh::get_group(const std::string& dim_name) const {
  return get_group(dim_index(dim_name));
}

DeviceMesh DeviceMesh::operator[](const std::string& dim_name) const {
  const auto& m = get(impl_);
  const int64_t d = dim_index(dim_name);
  if (ndim() == 1) return *this;
  TORCH_CHECK(m.coordinate.has_value(), "hyper_parallel::DeviceMesh: this rank is not part of ", to_string());
  auto sub = std::make_shared<Impl>();
  sub->device_type = m.device_type;
  sub->shape = {m.shape[static_cast<size_t>(d)]};
  sub->dim_names = {dim_name};
  sub->ranks = m.groups[static_cast<size_t>(d)].ranks();
  sub->coordinate = std::vector<int64_t>{(*m.coordinate)[static_cast<size_t>(d)]};
  sub->groups = {m.groups[static_cast<size_t>(d)]};
  sub->seed = m.seed;
  sub->root = m.root ? m.root : impl_;
  sub->root_dim = m.root ? m.root_dims[static_cast<size_t>(d)] : d;
  sub->root_dims = {sub->root_dim};
  return DeviceMesh(std::move(sub));
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& dim_names) const {
  const auto& m = get(impl_);
  HP_CHECK_T(c10::ValueError, !dim_names.empty(), "hyper_parallel::DeviceMesh::operator[]: no dimension named; the mesh has mesh_dim_names=",
             names_of(m.dim_names));
  if (dim_names.size() == 1) return (*this)[dim_names[0]];
  std::vector<int64_t> dims;
  for (const auto& n : dim_names) {
    dims.push_back(dim_index(n));
    HP_CHECK_T(c10::ValueError, dims.size() == 1 || dims[dims.size() - 2] < dims.back(), "hyper_parallel::DeviceMesh::operator[]: dimensions ",
               names_of(dim_names), " must be distinct and in the mesh's order ", names_of(m.dim_names));
  }
  if (dims.size() == m.shape.size()) return *this;
  TORCH_CHECK(m.coordinate.has_value(), "hyper_parallel::DeviceMesh: this rank is not part of ", to_string());
  auto sub = std::make_shared<Impl>();
  sub->device_type = m.device_type;
  sub->dim_names = dim_names;
  sub->seed = m.seed;
  sub->root = m.root ? m.root : impl_;
  std::vector<int64_t> coord;
  for (int64_t d : dims) {
    sub->shape.push_back(m.shape[static_cast<size_t>(d)]);
    coord.push_back((*m.coordinate)[static_cast<size_t>(d)]);
    sub->groups.push_back(m.groups[static_cast<size_t>(d)]);
    sub->root_dims.push_back(m.root ? m.root_dims[static_cast<size_t>(d)] : d);
  }
  sub->coordinate = coord;
  // The ranks that share this rank's coordinate along every other dimension, row-major.
  const auto st = strides_of(m.shape);
  int64_t base = 0;
  for (size_t d = 0; d < m.shape.size(); ++d)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) == dims.end()) base += (*m.coordinate)[d] * st[d];
  const auto sub_st = strides_of(sub->shape);
  const int64_t n = c10::multiply_integers(sub->shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t at = base;
    for (size_t k = 0; k < dims.size(); ++k) at += ((i / sub_st[k]) % sub->shape[k]) * st[static_cast<size_t>(dims[k])];
    sub->ranks.push_back(m.ranks[static_cast<size_t>(at)]);
  }
  return DeviceMesh(std::move(sub));
}

DeviceMesh DeviceMesh::unflatten(int64_t dim, const std::vector<int64_t>& sizes, const std::vector<std::string>& names) const {
  const auto& m = get(impl_);
  dim = wrap_mesh_dim(dim, ndim());
  HP_CHECK_T(c10::NotImplementedError, ndim() == 1, "hyper_parallel::DeviceMesh::unflatten: only a 1-D mesh can be unflattened; ",
             to_string(), " has ", ndim(), " dimensions (slice it first, e.g. mesh[\"tp\"])");
  int64_t total = 1;
  for (int64_t s : sizes) {
    HP_CHECK_T(c10::ValueError, s > 0, "hyper_parallel::DeviceMesh::unflatten: sizes ", c10::IntArrayRef(sizes),
               " hold a non-positive size");
    total *= s;
  }
  HP_CHECK_T(c10::ValueError, total == size(dim) && !sizes.empty(), "hyper_parallel::DeviceMesh::unflatten: sizes ",
             c10::IntArrayRef(sizes), " hold ", total, " ranks but dimension ", dim, " of ", to_string(), " has ", size(dim));
  HP_CHECK_T(c10::ValueError, names.size() == sizes.size(), "hyper_parallel::DeviceMesh::unflatten: ", names.size(),
             " names for ", sizes.size(), " dimensions");
  TORCH_CHECK(m.coordinate.has_value(), "hyper_parallel::DeviceMesh::unflatten: this rank is not part of ", to_string());
  auto out = std::make_shared<Impl>();
  out->device_type = m.device_type;
  out->shape = sizes;
  out->dim_names = names;
  out->ranks = m.ranks;
  out->seed = m.seed;
  place_and_group(*out, (*m.coordinate)[0]);
  if (!m.root || m.root_dims.size() != 1) return DeviceMesh(std::move(out));
  // A slice of a root: the root with that dimension split, whose other dimensions keep their
  // groups, and the result a slice of it.
  const Impl& r = *m.root;
  const size_t t = static_cast<size_t>(m.root_dims[0]), k = sizes.size();
  auto root = std::make_shared<Impl>();
  root->device_type = r.device_type;
  root->ranks = r.ranks;
  root->seed = r.seed;
  root->refined = m.root;
  root->refined_dim = static_cast<int64_t>(t);
  root->refined_count = static_cast<int64_t>(k);
  std::vector<int64_t> coord;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    if (d != t) {
      root->shape.push_back(r.shape[d]);
      root->dim_names.push_back(r.dim_names[d]);
      coord.push_back((*r.coordinate)[d]);
      root->groups.push_back(r.groups[d]);
      continue;
    }
    for (size_t i = 0; i < k; ++i) {
      root->shape.push_back(sizes[i]);
      root->dim_names.push_back(names[i]);
      coord.push_back((*out->coordinate)[i]);
      root->groups.push_back(out->groups[i]);
    }
  }
  root->coordinate = coord;
  out->root = root;
  for (size_t i = 0; i < k; ++i) out->root_dims.push_back(static_cast<int64_t>(t + i));
  return DeviceMesh(std::move(out));
}

c10::optional<std::vector<int64_t>> DeviceMesh::refines(const DeviceMesh& other) const {
  const auto& m = get(impl_);
  if (!m.refined || !(DeviceMesh(m.refined) == other)) return c10::nullopt;
  std::vector<int64_t> at;
  for (int64_t d = 0; d < other.ndim(); ++d) at.push_back(d <= m.refined_dim ? d : d + m.refined_count - 1);
  return at;
}

DeviceMesh DeviceMesh::root_mesh() const {
  const auto& m = get(impl_);
  return m.root ? DeviceMesh(m.root) : *this;
}

std::vector<int64_t> DeviceMesh::dims_in_root() const {
  const auto& m = get(impl_);
  if (m.root) return m.root_dims;
  std::vector<int64_t> all(m.shape.size());
  for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int64_t>(d);
  return all;
}

c10::optional<int64_t> DeviceMesh::dim_in_root() const {
  const auto& m = get(impl_);
  if (!m.root || m.root_dims.size() != 1) return c10::nullopt;
  return m.root_dim;
}

std::string DeviceMesh::short_string() const {
  const auto& m = get(impl_);
  std::string s = "mesh(";
  for (size_t i = 0; i < m.shape.size(); ++i) {
    if (i) s += ", ";
    if (i < m.dim_names.size() && !m.dim_names[i].empty()) s += m.dim_names[i] + "=";
    s += std::to_string(m.shape[i]);
  }
  return s + ")";
}

std::string DeviceMesh::to_string() const {
  const auto& m = get(impl_);
  std::ostringstream os;
  const auto st = strides_of(m.shape);
  // Nested brackets as torch prints the mesh tensor.
  std::function<void(size_t, int64_t)> rec = [&](size_t d, int64_t base) {
    os << '[';
    for (int64_t i = 0; i < m.shape[d]; ++i) {
      if (i) os << ", ";
      if (d + 1 == m.shape.size()) os << m.ranks[static_cast<size_t>(base + i)];
      else rec(d + 1, base + i * st[d]);
    }
    os << ']';
  };
  os << "DeviceMesh('" << m.device_type << "', ";
  rec(0, 0);
  if (!m.dim_names.empty()) os << ", mesh_dim_names=" << names_of(m.dim_names);
  os << ")";
  return os.str();
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  if (impl_ == other.impl_) return true;
  if (!impl_ || !other.impl_) return false;
  return impl_->device_type == other.impl_->device_type && impl_->shape == other.impl_->shape &&
         impl_->ranks == other.impl_->ranks && impl_->dim_names == other.impl_->dim_names;
}

namespace {
// The checks and construction both ways of making a root mesh share; `what` names the caller.
// Collective over the whole world (the seed's broadcast), as PyTorch's constructor is.
DeviceMesh make_root_mesh(const char* what, const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                          std::vector<int64_t> ranks, const std::vector<std::string>& mesh_dim_names) {
  TORCH_CHECK(is_initialized(), "hyper_parallel::", what, ": the process group is not initialized; call "
              "hyper_parallel::init_process_group() first");
  HP_CHECK_T(c10::ValueError, device_type == world_group().device_type(), "hyper_parallel::", what, ": device_type '",
             device_type, "' differs from the process group's '", world_group().device_type(),
             "' (init_process_group chose the backend for it; this build's collectives run on '",
             world_group().device_type(), "')");
  HP_CHECK_T(c10::ValueError, !mesh_shape.empty(), "hyper_parallel::", what, ": the mesh has no dimension");
  int64_t total = 1;
  for (int64_t s : mesh_shape) {
    HP_CHECK_T(c10::ValueError, s > 0, "hyper_parallel::", what, ": mesh shape ", c10::IntArrayRef(mesh_shape),
               " has a non-positive size");
    total *= s;
  }
  HP_CHECK_T(c10::ValueError, total == static_cast<int64_t>(ranks.size()), "hyper_parallel::", what, ": mesh shape ",
             c10::IntArrayRef(mesh_shape), " holds ", total, " ranks but ", ranks.size(), " were given");
  std::set<int64_t> distinct;
  for (int64_t r : ranks) {
    HP_CHECK_T(c10::ValueError, r >= 0 && r < get_world_size(), "hyper_parallel::", what, ": rank ", r,
               " is outside the world of size ", get_world_size());
    HP_CHECK_T(c10::ValueError, distinct.insert(r).second, "hyper_parallel::", what, ": rank ", r,
               " appears twice in the mesh ", c10::IntArrayRef(ranks));
  }
  if (!mesh_dim_names.empty()) {
    HP_CHECK_T(c10::ValueError, mesh_dim_names.size() == mesh_shape.size(), "hyper_parallel::", what,
               ": mesh_dim_names ", names_of(mesh_dim_names), " has ", mesh_dim_names.size(),
               " names for a mesh with ", mesh_shape.size(), " dimensions");
    std::set<std::string> seen;
    for (const auto& n : mesh_dim_names)
      HP_CHECK_T(c10::ValueError, seen.insert(n).second, "hyper_parallel::", what, ": mesh_dim_names ",
                 names_of(mesh_dim_names), " contains '", n, "' twice");
  }

  auto m = std::make_shared<DeviceMesh::Impl>();
  m->device_type = device_type;
  m->shape = mesh_shape;
  m->dim_names = mesh_dim_names;
  m->ranks = std::move(ranks);
  const auto me = std::find(m->ranks.begin(), m->ranks.end(), get_rank());
  // A rank outside the mesh holds it without a coordinate or groups (PyTorch's get_coordinate() None).
  if (me != m->ranks.end()) place_and_group(*m, me - m->ranks.begin());
  // Rank 0's seed on every rank (a control message: the mesh's setup, not the model's traffic).
  const int64_t seed = static_cast<int64_t>(at::detail::getDefaultCPUGenerator().current_seed());
  m->seed = static_cast<uint64_t>(control_broadcast(world_group(), {seed}, 0)[0]);
  return DeviceMesh(std::move(m));
}
}  // namespace

DeviceMesh::DeviceMesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& ranks,
                       const std::vector<std::string>& mesh_dim_names)
    : DeviceMesh(make_root_mesh("DeviceMesh", device_type, mesh_shape, ranks, mesh_dim_names)) {}

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  TORCH_CHECK(is_initialized(),
              "hyper_parallel::init_device_mesh: the process group is not initialized; call "
              "hyper_parallel::init_process_group() first");
  int64_t total = 1;
  bool positive = true;
  for (int64_t s : mesh_shape) {
    positive = positive && s > 0;
    total *= s;
  }
  // A non-positive or missing size is named by make_root_mesh.
  HP_CHECK_T(c10::ValueError, !positive || mesh_shape.empty() || total == get_world_size(), "hyper_parallel::init_device_mesh: mesh_shape ",
             c10::IntArrayRef(mesh_shape), " holds ", total, " ranks but the world size is ", get_world_size());
  std::vector<int64_t> ranks(positive ? static_cast<size_t>(total) : 0);
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int64_t>(r);
  return make_root_mesh("init_device_mesh", device_type, mesh_shape, std::move(ranks), mesh_dim_names);
}

MeshScope::MeshScope(DeviceMesh mesh) { t_mesh_stack.push_back(std::move(mesh)); }
MeshScope::~MeshScope() { t_mesh_stack.pop_back(); }

c10::optional<DeviceMesh> current_mesh() {
  if (t_mesh_stack.empty()) return c10::nullopt;
  return t_mesh_stack.back();
}

}  // namespace hyper_parallel
