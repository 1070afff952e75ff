#!/usr/bin/env python3
"""transformers' side of bench/decode_vs_hf.sh.

  hf_decode.py make DIR            a random-weight Qwen3 of ~0.4 B parameters (Qwen3-0.6B's widths,
                                   16 layers, tied embeddings), saved with save_pretrained (float32)
  hf_decode.py run DIR [--new-tokens N] [--prompt-len N]
                                   decode tokens/s at batch 1 and 8, float32 and bfloat16; under
                                   torchrun with WORLD_SIZE > 1 it loads with tp_plan="auto"
                                   (transformers' own tensor parallelism, Gloo on the CPU)
One JSON line per (dtype, batch), on rank 0, in the fields of qwen3_decode_bench.
"""
import json
import os
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

CONFIG = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
              max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=0)


def make(out):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**CONFIG))
    model.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")


def prompts(batch, length, vocab):
    ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b in range(batch):  # the prompts of qwen3_decode_bench: lengths length - b, left-padded
        n = length - b
        ids[b, length - n:] = torch.tensor([(s * 7919 + b * 104729) % vocab for s in range(n)])
        mask[b, length - n:] = 1
    return ids, mask


def timed(model, ids, mask, n):
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=0, eos_token_id=None)
    return time.perf_counter() - t0


def run(d, new_tokens, prompt_len):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    for dtype in (torch.float32, torch.bfloat16):
        t0 = time.perf_counter()
        kwargs = {"tp_plan": "auto"} if world > 1 else {}
        model = Qwen3ForCausalLM.from_pretrained(d, dtype=dtype, **kwargs).eval()
        load_s = time.perf_counter() - t0
        for batch in (1, 8):
            ids, mask = prompts(batch, prompt_len, model.config.vocab_size)
            timed(model, ids, mask, 2)  # warm-up
            one = timed(model, ids, mask, 1)  # the prefill and the first token
            total = timed(model, ids, mask, new_tokens)
            if rank == 0:
                print(json.dumps({"name": "hf_decode", "tp": world, "threads": torch.get_num_threads(),
                                  "dtype": str(dtype).replace("torch.", ""), "batch": batch,
                                  "prefill_tokens_per_s": round(batch * prompt_len / one, 1),
                                  "decode_tokens_per_s": round((new_tokens - 1) * batch / (total - one), 2),
                                  "load_s": round(load_s, 2)}), flush=True)
        del model


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
        run(sys.argv[2], int(args.get("--new-tokens", 16)), int(args.get("--prompt-len", 32)))
    else:
        sys.exit(__doc__)
