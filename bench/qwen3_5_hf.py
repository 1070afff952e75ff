#!/usr/bin/env python3
"""transformers' side of bench/qwen3_5_vs_hf.sh.

  qwen3_5_hf.py rule [--seq 4096] [--heads 16] [--head-dim 128]
      transformers' torch_chunk_gated_delta_rule, forward and backward, float32, the shapes and
      inputs' kinds of qwen3_5_bench rule
  qwen3_5_hf.py make DIR
      a random-weight Qwen3.5 at Qwen3.5-0.8B's widths with 8 layers (6 Gated DeltaNet, 2 gated
      attention), every 1-D weight random, saved with save_pretrained (float32)
  qwen3_5_hf.py decode DIR [--new-tokens 32] [--prompt-len 32]
      greedy decode tokens/s with generate on the same prompt as qwen3_5_bench decode
One JSON line per measurement, in the fields of qwen3_5_bench.
"""
import json
import sys
import time

import torch


def flag(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def rule():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule
    s, h, d = flag("--seq", 4096), flag("--heads", 16), flag("--head-dim", 128)
    torch.manual_seed(0)
    leaf = lambda t: t.requires_grad_(True)
    q, k, v = (leaf(torch.randn(1, s, h, d)) for _ in range(3))
    g, beta = leaf(-torch.rand(1, s, h) * 0.5), leaf(torch.rand(1, s, h))
    grad_out = torch.randn(1, s, h, d)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        out, _ = torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, use_qk_l2norm_in_kernel=True)
        out.backward(grad_out)
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    print(json.dumps({"name": "gdn_chunk_rule", "impl": "transformers", "seq": s, "heads": h, "head_dim": d,
                      "threads": torch.get_num_threads(), "forward_backward_ms": round(times[1] * 1e3, 1)}))


def make(out):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=8,
                               num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                               linear_key_head_dim=128, linear_value_head_dim=128, tie_word_embeddings=True)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.empty_like(p).uniform_(0.01, 4).log() if n.endswith("A_log") else p + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")


def decode(d):
    from transformers import Qwen3_5ForCausalLM
    n, length = flag("--new-tokens", 32), flag("--prompt-len", 32)
    model = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor([[(i * 7919) % model.config.vocab_size for i in range(length)]])
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, eos_token_id=None, pad_token_id=0)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        total = time.perf_counter() - t0
    # The steps after the prefill, as qwen3_5_bench counts them.
    print(json.dumps({"name": "qwen3_5_decode", "impl": "transformers", "threads": torch.get_num_threads(), "new_tokens": n - 1,
                      "decode_tokens_per_s": round((n - 1) / max(total - prefill, 1e-9), 1),
                      "prefill_tokens_per_s": round(length / prefill, 1)}))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "rule":
        rule()
    elif mode == "make":
        make(sys.argv[2])
    elif mode == "decode":
        decode(sys.argv[2])
    else:
        sys.exit(__doc__)
