#!/usr/bin/env python3
"""A random-weight Qwen3 checkpoint at a published shape, as transformers lays it out.

  make_qwen3_checkpoint.py OUT {0.6b,1.7b,4b,8b} [--shard-gb 2]

transformers builds the model on the meta device (names, shapes, tying: no memory), writes its
config.json, and the tensors are drawn (bf16, N(0, 0.02); norms 1) and written shard by shard
with safetensors, with model.safetensors.index.json, so a 16 GB checkpoint needs no 16 GB of RAM.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

# Qwen's published config.json values (Qwen3-0.6B ... Qwen3-8B).
SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
}


def main(out, size, shard_gb):
    config = Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, torch_dtype="bfloat16", **SHAPES[size])
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    names = [(n, tuple(p.shape)) for n, p in model.state_dict().items()
             if not (config.tie_word_embeddings and n == "lm_head.weight")]
    os.makedirs(out, exist_ok=True)
    config.save_pretrained(out)
    g = torch.Generator().manual_seed(0)
    limit = int(shard_gb * 1e9)
    shards, current, size_now = [], {}, 0
    for n, shape in names:
        t = torch.ones(shape, dtype=torch.bfloat16) if "norm" in n else \
            (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        if current and size_now + t.numel() * 2 > limit:
            shards.append(current)
            current, size_now = {}, 0
        current[n] = t
        size_now += t.numel() * 2
    shards.append(current)
    total = len(shards)
    weight_map, total_bytes = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        for n, t in shard.items():
            weight_map[n] = name
            total_bytes += t.numel() * 2
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, f, indent=2)
    print(f"{out}: Qwen3-{size} shapes, {total_bytes / 1e9:.2f} GB of bf16 in {total} files")


if __name__ == "__main__":
    args = sys.argv[1:]
    shard = 2.0
    if "--shard-gb" in args:
        k = args.index("--shard-gb")
        shard = float(args[k + 1])
        del args[k:k + 2]
    main(args[0], args[1], shard)
