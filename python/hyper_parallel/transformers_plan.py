"""A parallelize_module plan from a transformers model's own tensor-parallel plan
(``config.base_model_tp_plan`` and the model class's ``_tp_plan``), in our styles.

    parallelize_module(model, mesh["tp"], plan_from_transformers(model))
"""
from __future__ import annotations

import fnmatch
from typing import Dict, Iterable

import torch.nn as nn

from .placement_types import Replicate
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

# transformers' style names and what each means in ours (transformers/distributed/tensor_parallel.py
# registers them): the inputs and outputs each takes and gives, and where the weight is cut.
_STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "rowwise": lambda: RowwiseParallel(),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
    # A module fed this rank's heads (the local output of a colwise projection): its parameters
    # replicated, their gradients summed over the ranks. The heads are the second-to-last dim of
    # the [batch, seq, heads, head_dim] input.
    "replicated_with_grad_allreduce": lambda: SequenceParallel(sequence_dim=-2, use_local_output=True),
}
# Every rank keeps the whole parameter: what an unplanned module does already.
_NOTHING = {"replicate"}
# What these would need, named in the refusal.
_REFUSED = {
    "packed_colwise": "fused experts' gate_up_proj cut per expert (use the C++ library's ExpertParallel, or leave "
                      "the experts out of the plan)",
    "packed_rowwise": "fused experts' down_proj cut per expert (use the C++ library's ExpertParallel)",
    "moe_tp_experts": "transformers' fused MoE experts (use the C++ library's ExpertParallel)",
    "moe_identity_expert": "transformers' fused MoE experts",
    "grouped_gemm": "expert parallelism (use the C++ library's ExpertParallel)",
    "ep_router": "expert parallelism (use the C++ library's ExpertParallel)",
    "mla_kv_a_proj": "multi-head latent attention's split projection",
    "all_reduce": "an all-reduce of a module's output without a sharded weight",
    "local_params": "parameters kept as local tensors",
    "sequence_parallel": "transformers' sequence parallelism (use SequenceParallel with a plan of your own)",
}


def plan_from_transformers(model: nn.Module, *, exclude: Iterable[str] = ()) -> Dict[str, ParallelStyle]:
    """The plan, FQN glob to style, that transformers' ``tp_plan="auto"`` applies to ``model``:
    the plan transformers resolved on the model (``model._tp_plan``), else
    ``config.base_model_tp_plan`` under the base model's prefix and the class's ``_tp_plan``. With tied word embeddings the embedding is cut on the vocabulary as the
    output projection is (both Shard(0) of one tensor), so the tie stays one parameter. A style
    we cannot express (fused experts, expert parallelism) is refused by name, changing nothing.
    ``exclude``: FQN globs whose entries (and the entries under them) are left out, their modules
    replicated, e.g. ``exclude=["model.layers.*.mlp.experts"]`` for Qwen3-MoE's fused experts."""
    exclude = list(exclude)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "base_model_tp_plan"):
        raise TypeError(f"hyper_parallel.plan_from_transformers: a {type(model).__name__} is not a transformers model "
                        "(it has no config.base_model_tp_plan)")
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    resolved = getattr(model, "_tp_plan", None)
    if isinstance(resolved, dict) and any("." in k for k in resolved):
        # transformers 5 resolves the whole plan on the instance (the base model's entries under
        # its prefix, the embedding's, lm_head's): what tp_plan="auto" applies.
        entries = list(resolved.items())
    else:
        prefix = getattr(model, "base_model_prefix", "")
        under_base = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
        entries = [(f"{prefix}.{k}" if under_base else k, v) for k, v in (config.base_model_tp_plan or {}).items()]
        entries += list((resolved or {}).items())
    # An entry for modules this model does not have (the dense MLP of a model whose every layer
    # is sparse) is dropped here, as tp_plan="auto" drops it, rather than warned about.
    names = [n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
    entries = [(path, name) for path, name in entries if any(fnmatch.fnmatchcase(n, path) for n in names)]
    plan = {}
    for path, name in entries:
        if name in _NOTHING or any(fnmatch.fnmatchcase(path, e) or fnmatch.fnmatchcase(path, e + ".*") for e in exclude):
            continue
        if name in _REFUSED:
            raise NotImplementedError(f"hyper_parallel.plan_from_transformers: '{path}': '{name}' ({_REFUSED[name]}) has no "
                                      f"style here; leave it out with plan_from_transformers(model, exclude=['{path}']) "
                                      "(the module stays replicated) or write the plan by hand")
        if name not in _STYLES:
            raise NotImplementedError(f"hyper_parallel.plan_from_transformers: '{path}': transformers' style '{name}' "
                                      f"is not known here (known: {', '.join(sorted(_STYLES))})")
        plan[path] = _STYLES[name]()
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if out is not None and inp is not None and out.weight is inp.weight:
        names = {id(m): n for n, m in model.named_modules()}
        if names.get(id(inp)) is not None and names[id(inp)] not in plan:
            plan[names[id(inp)]] = _STYLES["embedding_rowwise"]()
    return plan
