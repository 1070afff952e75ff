"""plan_from_transformers: transformers' own tensor-parallel plans (config.base_model_tp_plan and
the class's _tp_plan) in our styles, on transformers' Qwen3 (tied and untied), Qwen3.5 text and
Qwen3-MoE, against one process (the same model run whole here): gradients after a step, and
generate()'s tokens. Run SPMD under torchrun or hprun: tp is every rank.
"""
import pytest
import torch

import hyper_parallel as hp
from hyper_parallel import (ColwiseParallel, Replicate, RowwiseParallel, SequenceParallel, Shard, init_device_mesh,
                            parallelize_module, plan_from_transformers)

torch.set_num_threads(1)
hp.init_process_group()
TP = hp.get_world_size()
MESH = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))


def seeded(seed, make):
    torch.manual_seed(seed)
    return make()


def full(t):
    return t.full_tensor() if isinstance(t, hp.DTensor) else t


def qwen3(tie):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=64,
                                        tie_word_embeddings=tie, attn_implementation="eager"))


def qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        head_dim=8, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, max_position_embeddings=64, layer_types=["linear_attention", "full_attention"],
        tie_word_embeddings=False, attn_implementation="eager"))


def expect_one_process(model, ref, rtol=1e-5, atol=1e-6):
    """A loss and its gradients, then greedy generation, as the same model in one process."""
    ids = seeded(1, lambda: torch.randint(0, 64, (2, 10)))
    loss, ref_loss = model(ids, labels=ids).loss, ref(ids, labels=ids).loss
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=atol)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(full(p.grad), q.grad, rtol=rtol * 10, atol=atol * 10, msg=name)
    model.eval()
    ref.eval()
    prompt = ids[:, :4]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=5, do_sample=False)
        ref_out = ref.generate(prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, ref_out), (out, ref_out)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_qwen3s_own_plan_gives_one_process_gradients_and_tokens(tie):
    model, ref = seeded(0, lambda: qwen3(tie)), seeded(0, lambda: qwen3(tie))
    plan = plan_from_transformers(model)
    assert isinstance(plan["model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.*.mlp.down_proj"], RowwiseParallel)
    assert isinstance(plan["model.layers.*.self_attn.q_norm"], SequenceParallel)
    assert isinstance(plan["model.embed_tokens"], RowwiseParallel)  # embedding_rowwise: cut on the vocabulary, as lm_head
    parallelize_module(model, MESH, plan)
    assert model.model.layers[0].mlp.gate_proj.weight.placements == (Shard(0),)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    expect_one_process(model, ref)


def test_qwen3_5s_own_plan_keeps_gated_deltanet_whole_and_gives_one_process_gradients_and_tokens():
    model, ref = seeded(0, qwen3_5), seeded(0, qwen3_5)
    parallelize_module(model, MESH, plan_from_transformers(model))
    assert model.model.layers[0].linear_attn.in_proj_qkv.weight.placements == (Shard(0),)
    expect_one_process(model, ref, rtol=2e-5, atol=2e-6)


def qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                                              num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                                              attn_implementation="eager"))


def test_qwen3_moes_fused_experts_are_refused_by_name_and_the_rest_of_its_plan_gives_one_process_values():
    model, ref = seeded(0, qwen3_moe), seeded(0, qwen3_moe)
    with pytest.raises(NotImplementedError, match="packed_colwise.*exclude"):
        plan_from_transformers(model)
    plan = plan_from_transformers(model, exclude=["model.layers.*.mlp.experts"])
    assert not any(".experts" in path for path in plan) and "model.layers.*.self_attn.o_proj" in plan
    parallelize_module(model, MESH, plan)
    assert model.model.layers[0].self_attn.q_proj.weight.placements == (Shard(0),)
    assert not isinstance(model.model.layers[0].mlp.experts.gate_up_proj, hp.DTensor)  # replicated: a plain tensor
    expect_one_process(model, ref)


def test_a_module_that_is_not_a_transformers_model_is_refused_by_name():
    with pytest.raises(TypeError, match="plan_from_transformers"):
        plan_from_transformers(torch.nn.Linear(2, 2))


def seed_d3_plan():
    """The seed's D3 plan on transformers' Qwen3: the norms sequence-parallel (activations cut on
    the sequence between the blocks, as DTensors: transformers reads the sequence length off the
    embeddings), Colwise projections gathering the sequence, Rowwise ones reduce-scattering it,
    lm_head gathering the logits."""
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)}
    for p in ("input_layernorm", "post_attention_layernorm"):
        plan[f"model.layers.*.{p}"] = SequenceParallel()
    for p in ("q_proj", "k_proj", "v_proj"):
        plan[f"model.layers.*.self_attn.{p}"] = ColwiseParallel(input_layouts=Shard(1))
    for p in ("q_norm", "k_norm"):
        plan[f"model.layers.*.self_attn.{p}"] = SequenceParallel(sequence_dim=-2, use_local_output=True)
    plan["model.layers.*.self_attn.o_proj"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    for p in ("gate_proj", "up_proj"):
        plan[f"model.layers.*.mlp.{p}"] = ColwiseParallel(input_layouts=Shard(1))
    plan["model.layers.*.mlp.down_proj"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    plan["model.norm"] = SequenceParallel()
    plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


def test_D3_the_seeds_sequence_parallel_plan_on_transformers_qwen3_trains_as_one_process_and_refuses_a_decode_step_naming_the_plan_to_generate_with():
    model, ref = seeded(0, lambda: qwen3(False)), seeded(0, lambda: qwen3(False))
    parallelize_module(model, MESH, seed_d3_plan())
    ids = seeded(1, lambda: torch.randint(0, 64, (2, 4 * TP)))
    loss, ref_loss = model(ids, labels=ids).loss, ref(ids, labels=ids).loss
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(full(p.grad), q.grad, rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(ValueError, match="plan_from_transformers"):
        with torch.no_grad():
            model(ids[:, :1])  # one token: a decode step
