#include "py_module.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/python_variable.h>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/tensor_parallel/api.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include <exception>
#include <unordered_map>

namespace hyper_parallel {
namespace python {

namespace {

// A Python value that is not a tensor or None (a tuple, a list, a number, a cache object):
// it rides through the C++ hooks in a capsule and comes back as the very same object.
struct PyObjectSlot : torch::CustomClassHolder {
  explicit PyObjectSlot(py::object o) : obj(std::move(o)) {}
  // The last reference may go on a thread without the GIL (a hook's result kept by C++).
  ~PyObjectSlot() override {
    py::gil_scoped_acquire gil;
    obj = py::object();
  }
  py::object obj;
};

// Python values to IValues and back, for one hook call. Made and destroyed with the GIL held:
// it keeps every slot it made alive until then, so that no Python object is released while the
// C++ hooks run without the GIL.
class Converter {
 public:
  /// A tensor or None as itself; any other object (a tuple, a list, a number, a config) in a
  /// capsule that comes back as that very object: the C++ hooks look only at tensors.
  c10::IValue in(const py::handle& h) {
    PyObject* o = h.ptr();
    if (THPVariable_Check(o)) return c10::IValue(THPVariable_Unpack(o));
    if (o == Py_None) return c10::IValue();
    auto slot = c10::make_intrusive<PyObjectSlot>(py::reinterpret_borrow<py::object>(h));
    keep_.push_back(slot);
    return c10::IValue::make_capsule(slot);
  }
  /// A module's output: a tuple (a namedtuple too) is several outputs, as PyTorch's
  /// PrepareModuleOutput takes it; anything else one.
  c10::IValue in_output(const py::handle& h) {
    if (!PyTuple_Check(h.ptr())) return in(h);
    std::vector<c10::IValue> items;
    for (const auto& item : h.cast<py::tuple>()) items.push_back(in(item));
    return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
  }

  py::object out(const c10::IValue& v) {
    if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
    if (v.isNone()) return py::none();
    if (v.isCapsule()) {
      auto slot = c10::dynamic_intrusive_pointer_cast<PyObjectSlot>(v.toCapsule());
      if (slot) return slot->obj;
    }
    if (v.isTuple()) {
      const auto& items = v.toTupleRef().elements();
      py::tuple t(items.size());
      for (size_t i = 0; i < items.size(); ++i) t[i] = out(items[i]);
      return std::move(t);
    }
    if (v.isBool()) return py::bool_(v.toBool());
    if (v.isInt()) return py::int_(v.toInt());
    if (v.isDouble()) return py::float_(v.toDouble());
    if (v.isString()) return py::str(v.toStringRef());
    HP_CHECK_T(c10::TypeError, false, "hyper_parallel::python::Converter::out: a hook returned a ", v.tagKind(),
               ", which has no Python value here");
    return py::none();
  }

 private:
  std::vector<c10::intrusive_ptr<PyObjectSlot>> keep_;
};

std::string type_name_of(const py::handle& module) {
  const py::handle type = py::type::handle_of(module);
  return py::str(type.attr("__module__")).cast<std::string>() + "." + py::str(type.attr("__qualname__")).cast<std::string>();
}

// The direct (non-recursive) parameters or buffers of a Python module: its _parameters or
// _buffers dict, None entries left out (an absent bias).
std::vector<std::pair<std::string, at::Tensor>> direct(const py::handle& module, const char* dict_name) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [k, v] : module.attr(dict_name).cast<py::dict>()) {
    if (v.is_none()) continue;
    HP_CHECK_T(c10::TypeError, THPVariable_Check(v.ptr()), "hyper_parallel::python::PyModuleAdapter: ", dict_name, " entry '",
               py::str(k).cast<std::string>(), "' is not a tensor");
    out.emplace_back(py::str(k).cast<std::string>(), THPVariable_Unpack(v.ptr()));
  }
  return out;
}

}  // namespace

py::object as_parameter(const at::Tensor& t) {
  // A tensor made in C++ has no Python object of its own yet, so its class is ours to set:
  // nn.Parameter(t) would make a detached alias instead.
  const py::object param = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  const py::object parameter_type = py::module_::import("torch.nn").attr("Parameter");
  if (!py::isinstance(param, parameter_type)) param.attr("__class__") = parameter_type;
  return param;
}

namespace {
// The Python module whose hook is running on this thread: the one torch called the hook for,
// which is not the mirror's module after copy.deepcopy (the copy shares the original's hooks).
thread_local PyObject* t_hooked_module = nullptr;

class HookedModule {
 public:
  explicit HookedModule(const py::object& module) : previous_(t_hooked_module) { t_hooked_module = module.ptr(); }
  ~HookedModule() { t_hooked_module = previous_; }
  HookedModule(const HookedModule&) = delete;
  HookedModule& operator=(const HookedModule&) = delete;

 private:
  PyObject* previous_;
};
}  // namespace

struct PyModuleAdapter::Call {
  std::unordered_map<PyObject*, std::weak_ptr<PyModuleAdapter>> by_module;
};

PyModuleAdapter::PyModuleAdapter(const py::handle& module, std::string type_name, nn::ModuleKind kind, std::shared_ptr<Call> call)
    : nn::Module(std::move(type_name)),
      module_ref_(py::module_::import("weakref").attr("ref")(module)),
      kind_(kind),
      call_(std::move(call)) {}

PyModuleAdapter::~PyModuleAdapter() {
  // The last owner may be a hook dropped by Python or a call's plan dropped without the GIL.
  py::gil_scoped_acquire gil;
  handles_.clear();
  module_ref_ = py::object();
}

std::shared_ptr<PyModuleAdapter> PyModuleAdapter::self() {
  return std::static_pointer_cast<PyModuleAdapter>(shared_from_this());
}

std::shared_ptr<PyModuleAdapter> PyModuleAdapter::mirror(const py::handle& module) {
  const py::module_ torch_nn = py::module_::import("torch.nn");
  HP_CHECK_T(c10::TypeError, py::isinstance(module, torch_nn.attr("Module")), "hyper_parallel::python::PyModuleAdapter::mirror: expected a torch.nn.Module, got ",
             py::str(py::type::handle_of(module).attr("__name__")).cast<std::string>());
  return mirror_in(module, std::make_shared<Call>());
}

std::shared_ptr<PyModuleAdapter> PyModuleAdapter::mirror_in(const py::handle& module, const std::shared_ptr<Call>& call) {
  if (auto it = call->by_module.find(module.ptr()); it != call->by_module.end())
    if (auto known = it->second.lock()) return known;
  const py::module_ torch_nn = py::module_::import("torch.nn");
  const nn::ModuleKind kind = py::isinstance(module, torch_nn.attr("Linear"))      ? nn::ModuleKind::Linear
                              : py::isinstance(module, torch_nn.attr("Embedding")) ? nn::ModuleKind::Embedding
                                                                                   : nn::ModuleKind::Other;
  std::shared_ptr<PyModuleAdapter> a(new PyModuleAdapter(module, type_name_of(module), kind, call));
  call->by_module[module.ptr()] = a;
  a->read_slots(module);
  return a;
}

void PyModuleAdapter::read_slots(const py::handle& module) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children;
  for (const auto& item : module.attr("named_children")()) {
    const auto pair = item.cast<py::tuple>();
    children.emplace_back(pair[0].cast<std::string>(), mirror_in(pair[1], call_));
  }
  nn::detail::reset_slots(*this, direct(module, "_parameters"), direct(module, "_buffers"), std::move(children));
  set_distribute_module_applied(*this, py::getattr(module, "_distribute_module_applied", py::bool_(false)).cast<bool>());
}

py::object PyModuleAdapter::py_module() const { return module_ref_(); }

void PyModuleAdapter::refresh_from_python() {
  const py::object m = py_module();
  HP_CHECK_T(c10::ValueError, !m.is_none(), "hyper_parallel::python::PyModuleAdapter::refresh_from_python: the module ", name(),
             " no longer exists");
  // Its subtree as Python has it now: modules already seen in this call keep their mirror.
  read_slots(m);
  for (const auto& child : named_children())
    if (auto* c = dynamic_cast<PyModuleAdapter*>(child.value().get())) c->refresh_from_python();
}

void PyModuleAdapter::write_back_to_python() {
  const py::object m = py_module();
  if (!m.is_none()) {
    const py::dict params = m.attr("_parameters");
    for (const auto& p : named_parameters(/*recurse=*/false)) {
      const py::object name = py::str(p.key());
      if (params.contains(name) && !params[name].is_none() &&
          THPVariable_Unpack(params[name].ptr()).unsafeGetTensorImpl() == p.value().unsafeGetTensorImpl())
        continue;
      // The very tensor the style made (nn.Parameter(t) would drop the gradient hook
      // distribute_module put on `t`: the reduction of a replicated parameter's Partial gradient);
      // a tied one is the same object in every owner.
      m.attr("__setattr__")(name, as_parameter(p.value()));
    }
    const py::dict buffers = m.attr("_buffers");
    for (const auto& b : named_buffers(/*recurse=*/false)) {
      const py::object name = py::str(b.key());
      if (buffers.contains(name) && !buffers[name].is_none() &&
          THPVariable_Unpack(buffers[name].ptr()).unsafeGetTensorImpl() == b.value().unsafeGetTensorImpl())
        continue;
      m.attr("__setattr__")(name, py::reinterpret_steal<py::object>(THPVariable_Wrap(b.value())));
    }
    if (distribute_module_applied(*this)) m.attr("_distribute_module_applied") = true;
  }
  for (const auto& child : named_children())
    if (auto* c = dynamic_cast<PyModuleAdapter*>(child.value().get())) c->write_back_to_python();
}

void PyModuleAdapter::release() {
  const auto children = named_children();
  nn::detail::reset_slots(*this, {}, {}, {});
  for (const auto& child : children)
    if (auto* c = dynamic_cast<PyModuleAdapter*>(child.value().get())) c->release();
}

nn::HookHandle PyModuleAdapter::keep_handle(py::object handle) {
  const uint64_t id = take_hook_id();
  handles_.emplace(id, std::move(handle));
  return handle_for(id);
}

void PyModuleAdapter::remove_hook(uint64_t id) {
  py::gil_scoped_acquire gil;
  if (auto it = handles_.find(id); it != handles_.end()) {
    it->second.attr("remove")();
    handles_.erase(it);
  }
}

// Each C++ hook becomes one Python hook of the module, registered now: hooks run in the order
// the styles and the user registered them, as under PyTorch. A hook that changes nothing
// returns None, so Python's own objects (containers, namedtuples) pass through untouched.
nn::HookHandle PyModuleAdapter::register_forward_pre_hook(nn::ForwardPreHook hook) {
  py::gil_scoped_acquire gil;
  const py::cpp_function fn([a = self(), hook = std::move(hook)](const py::object& module, const py::tuple& args) -> py::object {
    Converter c;
    std::vector<c10::IValue> pos;
    for (const auto& x : args) pos.push_back(c.in(x));
    const HookedModule hooked(module);
    const auto r = guarded<true>([&] { return hook(*a, pos); });
    if (!r) return py::none();
    py::tuple out(r->size());
    for (size_t i = 0; i < r->size(); ++i) out[i] = c.out((*r)[i]);
    return std::move(out);
  });
  return keep_handle(py_module().attr("register_forward_pre_hook")(fn));
}

nn::HookHandle PyModuleAdapter::register_forward_pre_hook_with_kwargs(nn::ForwardPreHookWithKwargs hook) {
  py::gil_scoped_acquire gil;
  const py::cpp_function fn(
      [a = self(), hook = std::move(hook)](const py::object& module, const py::tuple& args, const py::dict& kwargs) -> py::object {
        Converter c;
        std::vector<c10::IValue> pos;
        for (const auto& x : args) pos.push_back(c.in(x));
        nn::Kwargs kw;
        for (const auto& [k, v] : kwargs) kw.emplace_back(py::str(k).cast<std::string>(), c.in(v));
        const HookedModule hooked(module);
        const auto r = guarded<true>([&] { return hook(*a, pos, kw); });
        if (!r) return py::none();
        py::tuple new_args(r->first.size());
        for (size_t i = 0; i < r->first.size(); ++i) new_args[i] = c.out(r->first[i]);
        py::dict new_kwargs;
        for (const auto& [k, v] : r->second) new_kwargs[py::str(k)] = c.out(v);
        return py::make_tuple(new_args, new_kwargs);
      });
  return keep_handle(py_module().attr("register_forward_pre_hook")(fn, py::arg("with_kwargs") = true));
}

nn::HookHandle PyModuleAdapter::register_forward_hook(nn::ForwardHook hook, bool always_call) {
  py::gil_scoped_acquire gil;
  const py::cpp_function fn([a = self(), hook = std::move(hook)](const py::object& module, const py::tuple& args, const py::dict&,
                                                                  const py::object& output) -> py::object {
    Converter c;
    std::vector<c10::IValue> pos;
    for (const auto& x : args) pos.push_back(c.in(x));
    const c10::IValue out = c.in_output(output);
    const HookedModule hooked(module);
    const auto r = guarded<true>([&] { return hook(*a, pos, out); });
    return r ? c.out(*r) : py::none();
  });
  return keep_handle(py_module().attr("register_forward_hook")(fn, py::arg("with_kwargs") = true, py::arg("always_call") = always_call));
}

PyParallelStyle::PyParallelStyle(py::object style)
    : style_(std::move(style)), name_(py::str(py::type::handle_of(style_).attr("__name__")).cast<std::string>()) {}

PyParallelStyle::~PyParallelStyle() {
  py::gil_scoped_acquire gil;
  style_ = py::object();
  returned_ = py::object();
}

torch::nn::Module& PyParallelStyle::apply(torch::nn::Module& module, const DeviceMesh& device_mesh) {
  auto* a = dynamic_cast<PyModuleAdapter*>(&module);
  HP_CHECK_T(c10::TypeError, a != nullptr, "hyper_parallel::python::PyParallelStyle::apply: ", name_, " is a Python style; it applies to torch.nn ",
             "modules only, not to ", module.name());
  py::gil_scoped_acquire gil;
  a->write_back_to_python();  // what the C++ styles before it did, visible to its Python code
  returned_ = style_.attr("apply")(a->py_module(), py::cast(device_mesh));
  a->refresh_from_python();  // and its changes, visible to the styles after it
  return module;
}

void PyParallelStyle::validate(torch::nn::Module&, const std::string&, const DeviceMesh&) const {}

namespace {

std::shared_ptr<ParallelStyle> style_of(const py::handle& h) {
  if (py::isinstance<ParallelStyle>(h)) return h.cast<std::shared_ptr<ParallelStyle>>();
  return std::make_shared<PyParallelStyle>(py::reinterpret_borrow<py::object>(h));
}

PyModuleAdapter& adapter_of(torch::nn::Module& module, const char* where) {
  auto* a = dynamic_cast<PyModuleAdapter*>(&module);
  HP_CHECK_T(c10::TypeError, a != nullptr, "hyper_parallel::python::adapter_of: ", where, " reached ", module.name(),
             ", which is not a torch.nn module");
  return *a;
}

// The module a distribute_module input_fn / output_fn is called with: the one whose hook runs
// (a deepcopy's own), else the mirror's.
py::object hooked_module(torch::nn::Module& module, const char* where) {
  if (t_hooked_module != nullptr) return py::reinterpret_borrow<py::object>(t_hooked_module);
  return adapter_of(module, where).py_module();
}

// A Python callable kept by C++ callbacks, which are copied and dropped without the GIL: copies
// share one reference, and the last one takes the GIL to let it go.
std::shared_ptr<py::object> hold(const py::object& o) {
  return std::shared_ptr<py::object>(new py::object(o), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// A Python function's result as positional arguments: a tuple is the arguments, anything else one.
std::vector<c10::IValue> as_arguments(Converter& c, const py::object& r) {
  std::vector<c10::IValue> out;
  if (py::isinstance<py::tuple>(r))
    for (const auto& x : r.cast<py::tuple>()) out.push_back(c.in(x));
  else
    out.push_back(c.in(r));
  return out;
}

// One call on a torch.nn module: its mirror, made now and dropped at the end (nothing is kept
// for the next call). The caller (the Python face) puts the module back as it was when a call
// raises.
class MirrorCall {
 public:
  explicit MirrorCall(const py::handle& module) : root_(PyModuleAdapter::mirror(module)) {}
  ~MirrorCall() { root_->release(); }
  MirrorCall(const MirrorCall&) = delete;
  MirrorCall& operator=(const MirrorCall&) = delete;
  PyModuleAdapter& root() { return *root_; }
  /// Writes the result back to the Python modules. With a mesh, every rank of it learns whether
  /// that succeeded everywhere (it runs Python: a module's __setattr__), before returning.
  void write_back(const DeviceMesh* mesh, const std::string& what) {
    std::exception_ptr error;
    try {
      root_->write_back_to_python();
    } catch (...) {
      error = std::current_exception();
    }
    if (mesh == nullptr) {
      if (error) std::rethrow_exception(error);
      return;
    }
    py::gil_scoped_release no_gil;
    agree_on_user_code(*mesh, error, what);
  }

 private:
  std::shared_ptr<PyModuleAdapter> root_;
};

}  // namespace

void bind_parallelize(py::module_& m) {
  // PyTorch's distribute_module(module, device_mesh, partition_fn, input_fn, output_fn) with
  // Python functions, run by the C++ one on the module's mirror.
  m.def("_distribute_module", [](const py::object& module, const DeviceMesh& mesh, const py::object& partition_fn,
                                 const py::object& input_fn, const py::object& output_fn, std::optional<int64_t> src_data_rank) {
    guarded([&] {
      MirrorCall call(module);
      PartitionFn partition;
      InputFn in;
      OutputFn out;
      if (!partition_fn.is_none())
        partition = [fn = hold(partition_fn)](const std::string& name, torch::nn::Module& sub, const DeviceMesh& mesh) {
          // User code: every rank knows it succeeded everywhere before the collectives after it.
          std::exception_ptr error;
          {
            py::gil_scoped_acquire gil;
            try {
              PyModuleAdapter& a = adapter_of(sub, "distribute_module's partition_fn");
              (*fn)(name, a.py_module(), py::cast(mesh));
              a.refresh_from_python();
            } catch (...) {
              error = std::current_exception();
            }
          }
          agree_on_user_code(mesh, error, "distribute_module: partition_fn on '" + (name.empty() ? std::string("<root>") : name) + "'");
        };
      if (!input_fn.is_none())
        in = [fn = hold(input_fn)](nn::Module& mod, const std::vector<c10::IValue>& inputs, const DeviceMesh& mesh)
            -> c10::optional<std::vector<c10::IValue>> {
          py::gil_scoped_acquire gil;
          Converter c;
          py::tuple args(inputs.size());
          for (size_t i = 0; i < inputs.size(); ++i) args[i] = c.out(inputs[i]);
          const py::object r = (*fn)(hooked_module(mod, "distribute_module's input_fn"), args, py::cast(mesh));
          if (r.is_none()) return c10::nullopt;
          return as_arguments(c, r);
        };
      if (!output_fn.is_none())
        out = [fn = hold(output_fn)](nn::Module& mod, const c10::IValue& output, const DeviceMesh& mesh) -> c10::optional<c10::IValue> {
          py::gil_scoped_acquire gil;
          Converter c;
          const py::object r = (*fn)(hooked_module(mod, "distribute_module's output_fn"), c.out(output), py::cast(mesh));
          if (r.is_none()) return c10::nullopt;
          return c.in_output(r);
        };
      {
        py::gil_scoped_release no_gil;
        distribute_module(call.root(), mesh, partition, in, out, src_data_rank);
      }
      call.write_back(&mesh, "distribute_module: writing the result back to the torch.nn module");
    });
  });

  // plan: a style (a C++ style object or a Python ParallelStyle), or a list of (path, style).
  // Returns what a single style's apply returned (a Python style may wrap the module), else the module.
  m.def("_parallelize_module", [](const py::object& module, const std::optional<DeviceMesh>& mesh, const py::object& plan,
                                  std::optional<int64_t> src_data_rank) -> py::object {
    return guarded([&]() -> py::object {
      MirrorCall call(module);
      std::optional<ParallelizePlan> cpp_plan;
      std::shared_ptr<ParallelStyle> single;
      if (py::isinstance<py::list>(plan)) {
        std::vector<PlanEntry> entries;
        for (const auto& item : plan.cast<py::list>()) {
          const auto pair = item.cast<py::tuple>();
          entries.push_back(PlanEntry{pair[0].cast<std::string>(), style_of(pair[1])});
        }
        cpp_plan.emplace(std::move(entries));
      } else if (!plan.is_none()) {
        single = style_of(plan);
        cpp_plan.emplace(single);
      }
      {
        py::gil_scoped_release no_gil;  // the engine communicates; Python styles take the GIL back
        if (cpp_plan) parallelize_module(call.root(), mesh, *cpp_plan, src_data_rank);
        else parallelize_module(call.root(), mesh);
      }
      if (!cpp_plan) return module;
      const DeviceMesh used = mesh ? *mesh : *current_mesh();
      call.write_back(&used, "parallelize_module: writing the result back to the torch.nn module");
      if (auto* py_style = dynamic_cast<PyParallelStyle*>(single.get())) return py_style->returned();
      return module;
    });
  });

  // A built-in style's apply from Python (PyTorch's style._apply): that one style on that
  // module, with the style's own src_data_rank; no plan, no agreement between ranks.
  m.def("_apply_style", [](const std::shared_ptr<ParallelStyle>& style, const py::object& module, const DeviceMesh& mesh) {
    guarded([&] {
      MirrorCall call(module);
      {
        py::gil_scoped_release no_gil;
        style->apply(call.root(), mesh);
      }
      call.write_back(nullptr, "");
    });
  });
}

}  // namespace python
}  // namespace hyper_parallel
