"""Train transformers' Qwen3 on a dp x tp mesh with hyper_parallel, then save it so that
transformers loads it. Run under torchrun (or hprun), e.g. on 4 ranks as dp 2 x tp 2:

    torchrun --standalone --nproc-per-node 4 examples/python/train_qwen.py --tp 2 --steps 40

The model comes from a config (a small Qwen3 by default, or --config-json) or a checkpoint
directory (--model DIR, from_pretrained); the data are the bytes of a text file (token id = byte;
the vocabulary must have at least 256 entries). Each step: transformers' own tensor-parallel plan
(plan_from_transformers) over tp, fully_shard per decoder layer and at the root over dp,
torch.optim.AdamW with a warmup-then-cosine schedule and clip_grad_norm_. One progress line every
--log-freq steps. At the end rank 0 writes --out, which Qwen3ForCausalLM.from_pretrained loads.
"""
import argparse
import json
import math
import os
import time

import torch

import hyper_parallel as hp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a transformers checkpoint directory to start from (default: a new model from a config)")
    p.add_argument("--config-json", help="a Qwen3Config as JSON (default: a small Qwen3 over bytes)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size; dp is the world size / tp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8, help="sequences per step, split over dp")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--log-freq", type=int, default=10, help="print a progress line every N steps")
    p.add_argument("--data", default="/usr/share/common-licenses/GPL-3", help="a text file; its bytes are the tokens")
    p.add_argument("--out", default="qwen3_python_model", help="where rank 0 saves the trained model")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_model(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    if args.model:
        return Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    fields = dict(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=512, tie_word_embeddings=True)
    if args.config_json:
        with open(args.config_json) as f:
            fields.update(json.load(f))
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    return Qwen3ForCausalLM(Qwen3Config(**fields))


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hp.init_process_group()
    world, rank = hp.get_world_size(), hp.get_rank()
    if world % args.tp != 0:
        raise SystemExit(f"train_qwen: --tp {args.tp} does not divide the world size {world}")
    dp = world // args.tp
    if args.batch % dp != 0:
        raise SystemExit(f"train_qwen: --batch {args.batch} is not a multiple of dp = {dp}")
    mesh = hp.init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))

    model = make_model(args)
    if model.config.vocab_size < 256:
        raise SystemExit(f"train_qwen: the model's vocabulary ({model.config.vocab_size}) is smaller than the 256 byte tokens")
    if args.tp > 1:
        hp.parallelize_module(model, mesh["tp"], hp.plan_from_transformers(model))
    for layer in model.model.layers:
        hp.fully_shard(layer, mesh=mesh["dp"])
    hp.fully_shard(model, mesh=mesh["dp"])

    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def lr_at(step):  # linear warmup, then cosine to a tenth
        if step < args.warmup:
            return (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator().manual_seed(args.seed + 1)  # the same batches on every rank; each dp rank takes its rows
    dp_rank = mesh.get_local_rank("dp")
    rows = args.batch // dp
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        offsets = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=g)
        ids = torch.stack([data[o:o + args.seq] for o in offsets.tolist()])[dp_rank * rows:(dp_rank + 1) * rows]
        loss = model(ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad()
        if step % args.log_freq == 0 or step == args.steps:
            norm = norm.full_tensor() if isinstance(norm, hp.DTensor) else norm
            # The whole batch's loss: the mean of the dp ranks' (a Partial sum, made whole).
            mean = hp.DTensor.from_local(loss.detach().reshape(1), mesh["dp"], [hp.Partial()]).full_tensor() / dp
            elapsed = time.perf_counter() - start
            if rank == 0:
                print(f"step {step:4d}  loss {mean.item():.4f}  grad norm {norm.item():.3f}  "
                      f"lr {schedule.get_last_lr()[0]:.2e}  {args.log_freq * args.batch * args.seq / elapsed:.0f} tokens/s",
                      flush=True)
            start = time.perf_counter()

    # The whole model on rank 0 only, one tensor at a time; rank 0 writes it, then checks that
    # transformers loads it and gives the trained model's logits.
    sd = hp.get_model_state_dict(model, options=hp.StateDictOptions(full_state_dict=True, cpu_offload=True))
    probe = data[:args.seq].reshape(1, -1)
    with torch.no_grad():
        logits = model(probe).logits
    status = 0
    if rank == 0:
        from transformers import Qwen3ForCausalLM
        model.save_pretrained(args.out, state_dict=sd)
        loaded = Qwen3ForCausalLM.from_pretrained(args.out)
        with torch.no_grad():
            diff = (loaded(probe).logits - logits).abs().max().item()
        print(f"saved the trained model to {os.path.abspath(args.out)}; Qwen3ForCausalLM.from_pretrained gives its logits: "
              f"max |logits_loaded - logits_trained| = {diff:.2e}", flush=True)
        status = 0 if diff < 1e-4 else 1
    hp.barrier()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
