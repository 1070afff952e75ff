#include "py_module.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/python_variable.h>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/tensor_parallel/api.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

namespace hyper_parallel {
namespace python {

namespace {

// A Python value that is neither a tensor nor a scalar (a cache object, a list, a custom type):
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
  c10::IValue in(const py::handle& h) {
    PyObject* o = h.ptr();
    if (THPVariable_Check(o)) return c10::IValue(THPVariable_Unpack(o));
    if (o == Py_None) return c10::IValue();
    if (PyBool_Check(o)) return c10::IValue(o == Py_True);
    if (PyLong_CheckExact(o)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow == 0) return c10::IValue(static_cast<int64_t>(v));
    }
    if (PyFloat_CheckExact(o)) return c10::IValue(PyFloat_AS_DOUBLE(o));
    if (PyUnicode_CheckExact(o)) return c10::IValue(h.cast<std::string>());
    if (PyTuple_CheckExact(o)) {
      std::vector<c10::IValue> items;
      for (const auto& item : h.cast<py::tuple>()) items.push_back(in(item));
      return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
    }
    auto slot = c10::make_intrusive<PyObjectSlot>(py::reinterpret_borrow<py::object>(h));
    keep_.push_back(slot);
    return c10::IValue::make_capsule(slot);
  }

  py::object out(const c10::IValue& v) {
    if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
    if (v.isNone()) return py::none();
    if (v.isBool()) return py::bool_(v.toBool());
    if (v.isInt()) return py::int_(v.toInt());
    if (v.isDouble()) return py::float_(v.toDouble());
    if (v.isString()) return py::str(v.toStringRef());
    if (v.isTuple()) {
      const auto& items = v.toTupleRef().elements();
      py::tuple t(items.size());
      for (size_t i = 0; i < items.size(); ++i) t[i] = out(items[i]);
      return std::move(t);
    }
    if (v.isCapsule()) {
      auto slot = c10::dynamic_intrusive_pointer_cast<PyObjectSlot>(v.toCapsule());
      if (slot) return slot->obj;
    }
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

PyModuleAdapter::PyModuleAdapter(const py::handle& module, std::string type_name, nn::ModuleKind kind)
    : nn::Module(std::move(type_name)), module_ref_(py::module_::import("weakref").attr("ref")(module)), kind_(kind) {}

namespace {
// Each Python module's mirror, kept while the module lives: what the styles record in a module
// (that it was distributed, its FQN) must outlive one parallelize_module call.
py::object& mirrors() {
  static auto* registry = new py::object(py::module_::import("weakref").attr("WeakKeyDictionary")());  // never freed: no GIL at exit
  return *registry;
}
}  // namespace

std::shared_ptr<PyModuleAdapter> PyModuleAdapter::mirror(const py::handle& module) {
  const py::module_ torch_nn = py::module_::import("torch.nn");
  HP_CHECK_T(c10::TypeError, py::isinstance(module, torch_nn.attr("Module")), "hyper_parallel::parallelize_module: expected a torch.nn.Module, got ",
             py::str(py::type::handle_of(module).attr("__name__")).cast<std::string>());
  std::shared_ptr<PyModuleAdapter> a;
  const py::object known = mirrors().attr("get")(module);
  if (!known.is_none()) {
    a = known.cast<std::shared_ptr<PyModuleAdapter>>();
  } else {
    const nn::ModuleKind kind = py::isinstance(module, torch_nn.attr("Linear"))      ? nn::ModuleKind::Linear
                                : py::isinstance(module, torch_nn.attr("Embedding")) ? nn::ModuleKind::Embedding
                                                                                     : nn::ModuleKind::Other;
    a.reset(new PyModuleAdapter(module, type_name_of(module), kind));
    mirrors()[module] = py::cast(a);
  }
  a->refresh_from_python();
  const auto children = a->named_children();
  for (const auto& item : module.attr("named_children")()) {
    const auto pair = item.cast<py::tuple>();
    const auto name = pair[0].cast<std::string>();
    const auto child = mirror(pair[1]);
    if (!children.contains(name)) a->register_module(name, child);
    else HP_CHECK_T(c10::ValueError, children[name].get() == child.get(), "hyper_parallel::parallelize_module: submodule '", name,
                    "' of a ", a->name(), " was replaced after an earlier parallelize_module; parallelize the new module itself");
  }
  return a;
}

py::object PyModuleAdapter::py_module() const { return module_ref_(); }

void PyModuleAdapter::refresh_from_python() {
  const py::object m = py_module();
  HP_CHECK_T(c10::ValueError, !m.is_none(), "hyper_parallel::python::PyModuleAdapter::refresh_from_python: the module ", name(),
             " no longer exists");
  for (auto& [name, t] : direct(m, "_parameters")) {
    if (has_parameter(name)) nn::detail::set_parameter_unchecked(*this, name, t);
    else register_parameter(name, t, t.requires_grad());
  }
  for (auto& [name, t] : direct(m, "_buffers")) {
    if (named_buffers(/*recurse=*/false).contains(name)) nn::replace_buffer(*this, name, t);
    else register_buffer(name, t);
  }
}

void PyModuleAdapter::write_back_to_python() {
  const py::object m = py_module();
  if (!m.is_none()) {
    const py::dict params = m.attr("_parameters");
    const py::object parameter_type = py::module_::import("torch.nn").attr("Parameter");
    for (const auto& p : named_parameters(/*recurse=*/false)) {
      const py::object name = py::str(p.key());
      if (params.contains(name) && !params[name].is_none() &&
          THPVariable_Unpack(params[name].ptr()).unsafeGetTensorImpl() == p.value().unsafeGetTensorImpl())
        continue;
      // The very tensor the style made, as an nn.Parameter: nn.Parameter(t) would make a detached
      // alias, without the gradient hook distribute_module put on `t` (the reduction of a
      // replicated parameter's Partial gradient). The new DTensor has no Python object of its own
      // yet, so its class is ours to set.
      const py::object param = py::reinterpret_steal<py::object>(THPVariable_Wrap(p.value()));
      if (!py::isinstance(param, parameter_type)) param.attr("__class__") = parameter_type;
      m.attr("__setattr__")(name, param);
    }
    const py::dict buffers = m.attr("_buffers");
    for (const auto& b : named_buffers(/*recurse=*/false)) {
      const py::object name = py::str(b.key());
      if (buffers.contains(name) && !buffers[name].is_none() &&
          THPVariable_Unpack(buffers[name].ptr()).unsafeGetTensorImpl() == b.value().unsafeGetTensorImpl())
        continue;
      m.attr("__setattr__")(name, py::reinterpret_steal<py::object>(THPVariable_Wrap(b.value())));
    }
  }
  for (const auto& child : named_children())
    if (auto* c = dynamic_cast<PyModuleAdapter*>(child.value().get())) c->write_back_to_python();
}

void PyModuleAdapter::bridge_hooks(const std::shared_ptr<PyModuleAdapter>& self) {
  if (has_hooks() && !bridged_) {
    const py::object m = py_module();
    std::shared_ptr<PyModuleAdapter> a = self;
    const py::cpp_function pre([a](const py::object&, const py::tuple& args, const py::dict& kwargs) -> py::object {
      Converter c;
      std::vector<c10::IValue> pos;
      for (const auto& x : args) pos.push_back(c.in(x));
      nn::Kwargs kw;
      for (const auto& [k, v] : kwargs) kw.emplace_back(py::str(k).cast<std::string>(), c.in(v));
      guarded<true>([&] { a->run_forward_pre_hooks(pos, kw); });
      py::tuple new_args(pos.size());
      for (size_t i = 0; i < pos.size(); ++i) new_args[i] = c.out(pos[i]);
      py::dict new_kwargs;
      for (const auto& [k, v] : kw) new_kwargs[py::str(k)] = c.out(v);
      return py::make_tuple(new_args, new_kwargs);
    });
    const py::cpp_function post([a](const py::object&, const py::tuple& args, const py::dict&, const py::object& output) -> py::object {
      Converter c;
      std::vector<c10::IValue> pos;
      for (const auto& x : args) pos.push_back(c.in(x));
      c10::IValue out = c.in(output);
      const bool replaced = guarded<true>([&] { return a->run_forward_hooks(pos, out); });
      return replaced ? c.out(out) : py::none();
    });
    m.attr("register_forward_pre_hook")(pre, py::arg("with_kwargs") = true);
    m.attr("register_forward_hook")(post, py::arg("with_kwargs") = true);
    bridged_ = true;
  }
  for (const auto& child : named_children())
    if (auto c = std::dynamic_pointer_cast<PyModuleAdapter>(child.value())) c->bridge_hooks(c);
}

PyParallelStyle::PyParallelStyle(py::object style)
    : style_(std::move(style)), name_(py::str(py::type::handle_of(style_).attr("__name__")).cast<std::string>()) {}

PyParallelStyle::~PyParallelStyle() {
  py::gil_scoped_acquire gil;
  style_ = py::object();
}

torch::nn::Module& PyParallelStyle::apply(torch::nn::Module& module, const DeviceMesh& device_mesh) {
  auto* a = dynamic_cast<PyModuleAdapter*>(&module);
  HP_CHECK_T(c10::TypeError, a != nullptr, "hyper_parallel::python::PyParallelStyle::apply: ", name_,
             " is a Python style; it applies to torch.nn modules only, not to ", module.name());
  py::gil_scoped_acquire gil;
  a->write_back_to_python();  // what the C++ styles before it did, visible to its Python code
  style_.attr("apply")(a->py_module(), py::cast(device_mesh));
  // Its changes, visible to the styles after it.
  std::function<void(PyModuleAdapter&)> refresh = [&](PyModuleAdapter& x) {
    x.refresh_from_python();
    for (const auto& child : x.named_children())
      if (auto* c = dynamic_cast<PyModuleAdapter*>(child.value().get())) refresh(*c);
  };
  refresh(*a);
  return module;
}

void PyParallelStyle::validate(torch::nn::Module&, const std::string&, const DeviceMesh&) const {}

namespace {

std::shared_ptr<ParallelStyle> style_of(const py::handle& h) {
  if (py::isinstance<ParallelStyle>(h)) return h.cast<std::shared_ptr<ParallelStyle>>();
  return std::make_shared<PyParallelStyle>(py::reinterpret_borrow<py::object>(h));
}

}  // namespace

namespace {

PyModuleAdapter& adapter_of(torch::nn::Module& module, const char* where) {
  auto* a = dynamic_cast<PyModuleAdapter*>(&module);
  HP_CHECK_T(c10::TypeError, a != nullptr, "hyper_parallel::python::adapter_of: ", where, " reached ", module.name(),
             ", which is not a torch.nn module");
  return *a;
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

}  // namespace

void bind_modules(py::module_& m) {
  // PyTorch's distribute_module(module, device_mesh, partition_fn, input_fn, output_fn) with
  // Python functions, run by the C++ one on the module's mirror.
  m.def("_distribute_module", [](const py::object& module, const DeviceMesh& mesh, const py::object& partition_fn,
                                 const py::object& input_fn, const py::object& output_fn, std::optional<int64_t> src_data_rank) {
    guarded([&] {
      const auto root = PyModuleAdapter::mirror(module);
      PartitionFn partition;
      InputFn in;
      OutputFn out;
      if (!partition_fn.is_none())
        partition = [fn = hold(partition_fn)](const std::string& name, torch::nn::Module& sub, const DeviceMesh& mesh) {
          py::gil_scoped_acquire gil;
          PyModuleAdapter& a = adapter_of(sub, "distribute_module's partition_fn");
          (*fn)(name, a.py_module(), py::cast(mesh));
          a.refresh_from_python();
        };
      if (!input_fn.is_none())
        in = [fn = hold(input_fn)](nn::Module& mod, const std::vector<c10::IValue>& inputs, const DeviceMesh& mesh)
            -> c10::optional<std::vector<c10::IValue>> {
          py::gil_scoped_acquire gil;
          Converter c;
          py::tuple args(inputs.size());
          for (size_t i = 0; i < inputs.size(); ++i) args[i] = c.out(inputs[i]);
          const py::object r = (*fn)(adapter_of(mod, "distribute_module's input_fn").py_module(), args, py::cast(mesh));
          if (r.is_none()) return c10::nullopt;
          return as_arguments(c, r);
        };
      if (!output_fn.is_none())
        out = [fn = hold(output_fn)](nn::Module& mod, const c10::IValue& output, const DeviceMesh& mesh) -> c10::optional<c10::IValue> {
          py::gil_scoped_acquire gil;
          Converter c;
          const py::object r = (*fn)(adapter_of(mod, "distribute_module's output_fn").py_module(), c.out(output), py::cast(mesh));
          if (r.is_none()) return c10::nullopt;
          return c.in(r);
        };
      {
        py::gil_scoped_release no_gil;
        distribute_module(*root, mesh, partition, in, out, src_data_rank);
      }
      root->write_back_to_python();
      root->bridge_hooks(root);
    });
  });

  py::class_<PyModuleAdapter, std::shared_ptr<PyModuleAdapter>>(m, "_ModuleMirror");
  // plan: a style (a C++ style object or a Python ParallelStyle), or a list of (path, style).
  m.def("_parallelize_module", [](const py::object& module, const std::optional<DeviceMesh>& mesh, const py::object& plan,
                                  std::optional<int64_t> src_data_rank) {
    guarded([&] {
      const auto root = PyModuleAdapter::mirror(module);
      std::optional<ParallelizePlan> cpp_plan;
      if (py::isinstance<py::list>(plan)) {
        std::vector<PlanEntry> entries;
        for (const auto& item : plan.cast<py::list>()) {
          const auto pair = item.cast<py::tuple>();
          entries.push_back(PlanEntry{pair[0].cast<std::string>(), style_of(pair[1])});
        }
        cpp_plan.emplace(std::move(entries));
      } else if (!plan.is_none()) {
        cpp_plan.emplace(style_of(plan));
      }
      {
        py::gil_scoped_release no_gil;  // the engine communicates; Python styles take the GIL back
        if (cpp_plan) parallelize_module(*root, mesh, *cpp_plan, src_data_rank);
        else parallelize_module(*root, mesh);
      }
      root->write_back_to_python();
      root->bridge_hooks(root);
    });
  });
}

}  // namespace python
}  // namespace hyper_parallel
