// The layout-independent random functions for plain tensors and DTensors (dtensor/random.h).
#include <hyper_parallel/dtensor/random.h>

#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include "dtensor_impl.h"
#include "philox_draw.h"

namespace hyper_parallel {
namespace {

// A plain tensor is the whole tensor: its own global shape, at offset 0.
void draw_whole(at::Tensor& t, const DrawParams& p) {
  philox_draw(t, t.sizes().vec(), std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), p, next_random_key());
}

void check_floating(const at::Tensor& t, const char* what) {
  HP_CHECK_T(c10::TypeError, at::isFloatingType(t.scalar_type()), "hyper_parallel::", what, ": needs a floating-point tensor, got ",
             t.scalar_type());
}

DTensor random_dtensor(const char* what, const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& placements,
                       const at::TensorOptions& options, DrawParams::Kind kind) {
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(placements.size()) == mesh.ndim(), "hyper_parallel::", what, ": ",
             short_string(placements), " has ", placements.size(), " placements for a mesh with ", mesh.ndim(), " dimensions");
  Placements pl = normalize_placements(placements, static_cast<int64_t>(shape.size()));
  for (const auto& p : pl)
    HP_CHECK_T(c10::ValueError, !p.is_partial(), "hyper_parallel::", what, ": a random tensor cannot be ", p.short_string());
  const at::ScalarType dtype = options.has_dtype() ? options.dtype().toScalarType() : at::kFloat;
  HP_CHECK_T(c10::TypeError, at::isFloatingType(dtype), "hyper_parallel::", what, ": needs a floating-point dtype, got ", dtype);
  const auto coord = mesh.get_coordinate();
  HP_CHECK_T(c10::ValueError, coord.has_value(), "hyper_parallel::", what, ": this rank is not part of ", mesh.to_string());
  auto spec = std::make_shared<DTensorSpec>(mesh, std::move(pl), shape, dtype);
  auto [local_shape, offset] = spec->local_shape_and_offset(*coord);
  const c10::Device device = options.has_device() ? options.device() : c10::Device(mesh.device_type());
  at::Tensor local = at::empty(local_shape, at::TensorOptions().dtype(dtype).device(device));
  DrawParams p;
  p.kind = kind;
  philox_draw(local, shape, offset, p, next_random_key(mesh, what));
  at::Tensor out = make_dtensor(std::move(local), std::move(spec));
  if (options.requires_grad()) out.set_requires_grad(true);
  return DTensor(std::move(out));
}

}  // namespace

// A meta tensor (plain, or a DTensor whose local piece is on meta) has no values to fill, and
// takes no key: as with torch's generators, building a model on meta draws nothing, so
// materialising it afterwards (init_parameters) draws what eager construction would have.
at::Tensor& uniform_(at::Tensor& t, double from, double to) {
  if (t.is_meta()) return t;
  if (is_dtensor(t)) return t.uniform_(from, to);
  check_floating(t, "uniform_");
  HP_CHECK_T(c10::ValueError, from <= to, "hyper_parallel::uniform_: expects from <= to, got from=", from, " to=", to);
  DrawParams p;
  p.a = from;
  p.b = to;
  at::NoGradGuard no_grad;
  draw_whole(t, p);
  return t;
}

at::Tensor& normal_(at::Tensor& t, double mean, double std) {
  if (t.is_meta()) return t;
  if (is_dtensor(t)) return t.normal_(mean, std);
  check_floating(t, "normal_");
  HP_CHECK_T(c10::ValueError, std >= 0.0, "hyper_parallel::normal_: expects std >= 0.0, got std=", std);
  DrawParams p;
  p.kind = DrawParams::Kind::Normal;
  p.a = mean;
  p.b = std;
  at::NoGradGuard no_grad;
  draw_whole(t, p);
  return t;
}

at::Tensor& bernoulli_(at::Tensor& t, double prob) {
  if (t.is_meta()) return t;
  if (is_dtensor(t)) return t.bernoulli_(prob);
  HP_CHECK_T(c10::ValueError, prob >= 0.0 && prob <= 1.0, "hyper_parallel::bernoulli_: expects p in [0, 1], got ", prob);
  DrawParams p;
  p.kind = DrawParams::Kind::Bernoulli;
  p.a = prob;
  at::NoGradGuard no_grad;
  draw_whole(t, p);
  return t;
}

at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  HP_CHECK_T(c10::ValueError, p >= 0.0 && p <= 1.0, "hyper_parallel::dropout: dropout probability has to be between 0 and 1, but got ", p);
  if (!train || p == 0.0 || input.numel() == 0) return input;
  if (p == 1.0) return input * at::zeros({}, input.options());
  // As at::dropout on the CPU (which a DTensor's at::dropout decomposes into): a noise tensor of
  // bernoulli(1 - p), divided by 1 - p, times the input; only the noise's values are ours.
  at::Tensor noise = at::empty_like(input, at::MemoryFormat::Contiguous);
  hyper_parallel::bernoulli_(noise, 1.0 - p);
  noise.div_(1.0 - p);
  return input * noise;
}

DTensor rand(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& placements, const at::TensorOptions& options) {
  return random_dtensor("rand", shape, mesh, placements, options, DrawParams::Kind::Uniform);
}

DTensor randn(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& placements, const at::TensorOptions& options) {
  return random_dtensor("randn", shape, mesh, placements, options, DrawParams::Kind::Normal);
}

}  // namespace hyper_parallel
