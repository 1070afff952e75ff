#pragma once
// The tensor-parallel styles (PyTorch's torch.distributed.tensor.parallel.style).
// A style says how one module is split and what layouts its inputs and outputs have; apply()
// changes the module in place (parameters, hooks) and returns it. Settings are constructor
// arguments with the seed's defaults, also settable by name:
//   hp::RowwiseParallel().output_layouts(hp::Shard(1)).use_local_output(false)
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/dtensor/placement.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// Layouts of a module's positional inputs or outputs: one placement per slot, nullopt for slots
/// that pass through unchanged. A single Placement means one slot.
using Layouts = std::vector<c10::optional<Placement>>;
/// Layouts of named inputs.
using KwargLayouts = std::map<std::string, c10::optional<Placement>>;

/// The abstract base: cannot be instantiated, subclasses implement apply().
class ParallelStyle {
 public:
  virtual ~ParallelStyle();
  /// Where full parameters come from: group rank 0 scatters/broadcasts them (default), or
  /// nullopt: every rank slices its own copy. parallelize_module writes it before apply().
  c10::optional<int64_t> src_data_rank = 0;

  /// Splits `module` over the 1-D `device_mesh` and installs its hooks; returns the module.
  /// Checks everything first (validate) so that a failure changes nothing.
  virtual torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) = 0;
  /// Throws the seed's error for anything apply() would fail on; changes nothing. `fqn` names
  /// the module in messages.
  virtual void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const = 0;
  /// Whether apply() calls distribute_module (at most one such style per module).
  virtual bool distributes_module() const { return false; }
  /// Whether apply() runs code the library cannot check beforehand (a user's style, a Python
  /// one): parallelize_module then has every rank agree that it succeeded before the next entry,
  /// so that a rank that failed never leaves the others in a collective. The built-in styles say no.
  virtual bool runs_user_code() const { return true; }
  /// e.g. "ColwiseParallel".
  virtual std::string name() const = 0;
  /// The name with the parameters that change what apply() does, e.g.
  /// "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=-1), use_local_output=1)";
  /// parallelize_module compares it across ranks.
  virtual std::string describe() const { return name(); }
};

/// Shards Linear on out_features (weight, bias Shard(0)) or Embedding on embedding_dim (weight
/// Shard(1)). The first input is taken to be laid out by input_layouts and made Replicate; the
/// output (sharded on its last dim) is redistributed to output_layouts, and returned as a local
/// tensor when use_local_output.
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(Placement input_layouts = Replicate(), Placement output_layouts = Shard(-1),
                           bool use_local_output = true)
      : input_layouts_(input_layouts), output_layouts_(output_layouts), use_local_output_(use_local_output) {}
  ColwiseParallel& input_layouts(Placement p) { input_layouts_ = p; return *this; }
  ColwiseParallel& output_layouts(Placement p) { output_layouts_ = p; return *this; }
  ColwiseParallel& use_local_output(bool b) { use_local_output_ = b; return *this; }
  const Placement& input_layouts() const { return input_layouts_; }
  const Placement& output_layouts() const { return output_layouts_; }
  /// Fixed to Replicate: a sequence-sharded input is all-gathered first.
  Placement desired_input_layouts() const { return Replicate(); }
  bool use_local_output() const { return use_local_output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "ColwiseParallel"; }
  bool runs_user_code() const override { return false; }
  std::string describe() const override {
    return name() + "(input_layouts=" + input_layouts_.to_string() + ", output_layouts=" + output_layouts_.to_string() +
           ", use_local_output=" + std::to_string(use_local_output_) + ")";
  }

 private:
  Placement input_layouts_, output_layouts_;
  bool use_local_output_;
};

/// Shards Linear on in_features (weight Shard(1), bias Replicate) or Embedding on the vocabulary
/// (weight Shard(0), looked up with a mask so the Partial sum is exact). The first input is laid
/// out by input_layouts and made Shard(-1) (Replicate for Embedding); the Partial output is
/// reduced into output_layouts (Replicate: all-reduce; Shard(d): reduce-scatter), in
/// reduce_dtype when given (the result keeps that dtype).
class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(Placement input_layouts = Shard(-1), Placement output_layouts = Replicate(),
                           bool use_local_output = true, c10::optional<at::ScalarType> reduce_dtype = c10::nullopt)
      : input_layouts_(input_layouts), output_layouts_(output_layouts), use_local_output_(use_local_output),
        reduce_dtype_(reduce_dtype) {}
  RowwiseParallel& input_layouts(Placement p) { input_layouts_ = p; return *this; }
  RowwiseParallel& output_layouts(Placement p) { output_layouts_ = p; return *this; }
  RowwiseParallel& use_local_output(bool b) { use_local_output_ = b; return *this; }
  RowwiseParallel& reduce_dtype(c10::optional<at::ScalarType> t) { reduce_dtype_ = t; return *this; }
  const Placement& input_layouts() const { return input_layouts_; }
  const Placement& output_layouts() const { return output_layouts_; }
  /// Shard(-1) for Linear; apply() switches it to Replicate for Embedding (it looks up replicated ids).
  const Placement& desired_input_layouts() const { return desired_input_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  c10::optional<at::ScalarType> reduce_dtype() const { return reduce_dtype_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "RowwiseParallel"; }
  bool runs_user_code() const override { return false; }
  std::string describe() const override {
    return name() + "(input_layouts=" + input_layouts_.to_string() + ", output_layouts=" + output_layouts_.to_string() +
           ", use_local_output=" + std::to_string(use_local_output_) + ")";
  }

 private:
  Placement input_layouts_, output_layouts_;
  Placement desired_input_layouts_ = Shard(-1);
  bool use_local_output_;
  c10::optional<at::ScalarType> reduce_dtype_;
};

/// For norms, dropout and other modules that work on any sequence shard: parameters replicated,
/// the first input (a plain tensor) taken as Shard(sequence_dim); a DTensor input is kept as it
/// is. The output stays a DTensor unless use_local_output.
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false)
      : sequence_dim_(sequence_dim), use_local_output_(use_local_output) {}
  SequenceParallel& sequence_dim(int64_t d) { sequence_dim_ = d; return *this; }
  SequenceParallel& use_local_output(bool b) { use_local_output_ = b; return *this; }
  int64_t sequence_dim() const { return sequence_dim_; }
  bool use_local_output() const { return use_local_output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "SequenceParallel"; }
  bool runs_user_code() const override { return false; }
  std::string describe() const override {
    return name() + "(sequence_dim=" + std::to_string(sequence_dim_) + ", use_local_output=" + std::to_string(use_local_output_) + ")";
  }

 private:
  int64_t sequence_dim_;
  bool use_local_output_;
};

/// Keeps every parameter whole (Replicate DTensors) for modules that must not be split (routers,
/// norms without sequence parallelism). Note the singular names (as PyTorch's).
class NoParallel : public ParallelStyle {
 public:
  explicit NoParallel(Placement input_layout = Replicate(), Placement desired_input_layout = Replicate(),
                      Placement output_layout = Replicate(), bool use_local_output = true)
      : input_layout_(input_layout), desired_input_layout_(desired_input_layout), output_layout_(output_layout),
        use_local_output_(use_local_output) {}
  NoParallel& input_layout(Placement p) { input_layout_ = p; return *this; }
  NoParallel& desired_input_layout(Placement p) { desired_input_layout_ = p; return *this; }
  NoParallel& output_layout(Placement p) { output_layout_ = p; return *this; }
  NoParallel& use_local_output(bool b) { use_local_output_ = b; return *this; }
  const Placement& input_layout() const { return input_layout_; }
  const Placement& desired_input_layout() const { return desired_input_layout_; }
  const Placement& output_layout() const { return output_layout_; }
  bool use_local_output() const { return use_local_output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  bool distributes_module() const override { return true; }
  std::string name() const override { return "NoParallel"; }
  bool runs_user_code() const override { return false; }
  std::string describe() const override {
    return name() + "(input_layout=" + input_layout_.to_string() + ", desired_input_layout=" +
           desired_input_layout_.to_string() + ", output_layout=" + output_layout_.to_string() +
           ", use_local_output=" + std::to_string(use_local_output_) + ")";
  }

 private:
  Placement input_layout_, desired_input_layout_, output_layout_;
  bool use_local_output_;
};

/// Converts a module's inputs at its boundary; parameters untouched. input_layouts[i] is the
/// layout of positional input i (nullopt: passes through), desired_input_layouts[i] what forward
/// gets; the kwarg maps do the same for named inputs. use_local_output hands forward local
/// tensors. Throws hyper_parallel::AssertionError at construction for mismatched lengths.
/// e.g. `PrepareModuleInput({Shard(1)}, {Replicate()})`
class PrepareModuleInput : public ParallelStyle {
 public:
  explicit PrepareModuleInput(c10::optional<Layouts> input_layouts = c10::nullopt,
                              c10::optional<Layouts> desired_input_layouts = c10::nullopt,
                              c10::optional<KwargLayouts> input_kwarg_layouts = c10::nullopt,
                              c10::optional<KwargLayouts> desired_input_kwarg_layouts = c10::nullopt,
                              bool use_local_output = false);
  const c10::optional<Layouts>& input_layouts() const { return input_layouts_; }
  const c10::optional<Layouts>& desired_input_layouts() const { return desired_input_layouts_; }
  const KwargLayouts& input_kwarg_layouts() const { return input_kwarg_layouts_; }
  const KwargLayouts& desired_input_kwarg_layouts() const { return desired_input_kwarg_layouts_; }
  bool use_local_output() const { return use_local_output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return "PrepareModuleInput"; }
  bool runs_user_code() const override { return false; }

 private:
  c10::optional<Layouts> input_layouts_, desired_input_layouts_;
  KwargLayouts input_kwarg_layouts_, desired_input_kwarg_layouts_;
  bool use_local_output_;
};

/// Converts a module's outputs (one tensor, or a tuple with nullopt slots passing through) from
/// output_layouts to desired_output_layouts, reducing a Partial in reduce_dtype when given.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Layouts output_layouts, Layouts desired_output_layouts, bool use_local_output = true,
                      c10::optional<at::ScalarType> reduce_dtype = c10::nullopt);
  const Layouts& output_layouts() const { return output_layouts_; }
  const Layouts& desired_output_layouts() const { return desired_output_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  c10::optional<at::ScalarType> reduce_dtype() const { return reduce_dtype_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
  bool runs_user_code() const override { return false; }

 private:
  Layouts output_layouts_, desired_output_layouts_;
  bool use_local_output_;
  c10::optional<at::ScalarType> reduce_dtype_;
};

/// PrepareModuleInput and PrepareModuleOutput together; use_local_input is the input side's
/// use_local_output.
class PrepareModuleInputOutput : public ParallelStyle {
 public:
  PrepareModuleInputOutput(c10::optional<Layouts> input_layouts, c10::optional<Layouts> desired_input_layouts,
                           Layouts output_layouts, Layouts desired_output_layouts,
                           c10::optional<KwargLayouts> input_kwarg_layouts = c10::nullopt,
                           c10::optional<KwargLayouts> desired_input_kwarg_layouts = c10::nullopt,
                           bool use_local_input = false, bool use_local_output = true,
                           c10::optional<at::ScalarType> reduce_dtype = c10::nullopt);
  const PrepareModuleInput& input() const { return input_; }
  const PrepareModuleOutput& output() const { return output_; }

  torch::nn::Module& apply(torch::nn::Module& module, const DeviceMesh& device_mesh) override;
  void validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& device_mesh) const override;
  std::string name() const override { return "PrepareModuleInputOutput"; }
  bool runs_user_code() const override { return false; }

 private:
  PrepareModuleInput input_;
  PrepareModuleOutput output_;
};

}  // namespace hyper_parallel
