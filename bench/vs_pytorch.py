#!/usr/bin/env python3
"""hyper_parallel against PyTorch's own DTensor and tensor parallelism, on this machine, in one run.

Runs the same workloads on both, alternately (ours, PyTorch's, ours, ...), each as a 2-rank job
with one intra-op thread per rank: our side is `hp_bench --vs-pytorch` (bench/vs_pytorch_cases.cpp)
under hprun, PyTorch's is this script (--pytorch-rank) under the same launcher, on Gloo. Prints one
JSON line per figure: {"name": "vs_pytorch_<figure>", "ours": ..., "pytorch": ..., "unit": ...,
"ratio": ours / pytorch, "target": ..., "met": ...}; with --ours-gloo our side also runs with
HP_TRANSPORT=gloo (the transport PyTorch uses) and the lines carry "ours_gloo" and "ratio_gloo".

    .venv/bin/python bench/vs_pytorch.py [--build build] [--rounds 3] [--ours-gloo]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

# Targets (DESIGN.md §6): per-op overhead at most 1/20 of PyTorch's, steps at most 0.8x its time.
TARGETS = {"op_overhead": 0.05, "adam_step": 0.8, "step": 0.8}


def target_of(figure):
    return next(v for k, v in TARGETS.items() if figure.startswith(k))


# ---------------------------------------------------------------- PyTorch's side (one rank)

def time_us(fn, iters, reps=11, between=None):
    """Median over reps of the mean time per call, in microseconds (after a warm-up)."""
    for _ in range(iters // 4 + 1):
        fn()
    t = []
    for _ in range(reps):
        if between:
            between()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(t)


def time_pair(base, cand, iters, reps=11):
    """Baseline and candidate timed in alternating repetitions: (baseline_us, candidate_us)."""
    for _ in range(iters // 4 + 1):
        base()
        cand()
    tb, tc = [], []
    for _ in range(reps):
        tb.append(time_us(base, iters, 1))
        tc.append(time_us(cand, iters, 1))
    return statistics.median(tb), statistics.median(tc)


def pytorch_rank():
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out = {}

    def barrier():
        dist.barrier()

    # Per-op overhead: [8, 16] Shard(0) activations, replicated weights, against the plain op.
    torch.manual_seed(0)
    a, b, w, bias = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 16), torch.randn(16)
    lw, lb = torch.randn(16), torch.randn(16)
    S0, R = [Shard(0)], [Replicate()]
    da, db = distribute_tensor(a, mesh, S0), distribute_tensor(b, mesh, S0)
    dw, dbias = distribute_tensor(w, mesh, R), distribute_tensor(bias, mesh, R)
    dlw, dlb = distribute_tensor(lw, mesh, R), distribute_tensor(lb, mesh, R)
    with torch.no_grad():
        cases = {
            "add": (lambda: torch.add(a, b), lambda: torch.add(da, db)),
            "linear": (lambda: F.linear(a, w, bias), lambda: F.linear(da, dw, dbias)),
            "layer_norm": (lambda: F.layer_norm(a, (16,), lw, lb), lambda: F.layer_norm(da, (16,), dlw, dlb)),
        }
        for op, (plain, dfn) in cases.items():
            p, d = time_pair(plain, dfn, 2000)
            out["op_overhead_" + op] = (d - p, "us")

    # Adam over the DTensor parameters of a [256 -> 1024 -> 256] MLP (Colwise, Rowwise).
    h = 256
    params = []
    for shape, pl in (((4 * h, h), S0), ((4 * h,), S0), ((h, 4 * h), [Shard(1)]), ((h,), R)):
        prm = nn.Parameter(distribute_tensor(torch.randn(shape), mesh, pl))
        prm.grad = distribute_tensor(torch.randn(shape), mesh, pl)
        params.append(prm)
    adam = torch.optim.Adam(params, lr=1e-3)
    out["adam_step"] = (time_us(adam.step, 10), "us")

    # Colwise + Rowwise MLP training step: x [256, 256], intermediate 768, gelu, SGD.
    class Mlp(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

        def forward(self, x):
            return self.down(F.gelu(self.up(x)))

    torch.manual_seed(0)
    mlp = parallelize_module(Mlp(256, 768), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    sgd = torch.optim.SGD(mlp.parameters(), lr=1e-4)
    x, wx = torch.randn(256, 256), torch.randn(256, 256)

    def mlp_step():
        (mlp(x) * wx).sum().backward()
        sgd.step()
        sgd.zero_grad()

    out["step_mlp"] = (time_us(lambda: (barrier(), mlp_step()), 3) / 1000, "ms")

    # A Qwen3 decoder layer (the model of examples/qwen3: q/k RMSNorm per head, rotary, GQA, causal
    # softmax attention, SwiGLU), TP over the world with the plan of torchtitan's Llama: without
    # sequence parallelism a replicated residual stream; with it a sequence-sharded one, norms
    # SequenceParallel, attention and MLP inputs gathered by PrepareModuleInput.
    hid, inter, heads, kv_heads, hd, theta, eps = 256, 768, 8, 4, 32, 1e6, 1e-6

    def rotate_half(t):
        t1, t2 = t.chunk(2, -1)
        return torch.cat((-t2, t1), -1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hid, heads * hd, bias=False)
            self.k_proj = nn.Linear(hid, kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(hid, kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(heads * hd, hid, bias=False)
            self.q_norm, self.k_norm = nn.RMSNorm(hd, eps=eps), nn.RMSNorm(hd, eps=eps)

        def forward(self, t):
            q, k, v = self.q_proj(t), self.k_proj(t), self.v_proj(t)
            bsz, s = q.shape[0], q.shape[1]
            q = self.q_norm(q.view(bsz, s, -1, hd)).transpose(1, 2)
            k = self.k_norm(k.view(bsz, s, -1, hd)).transpose(1, 2)
            v = v.view(bsz, s, -1, hd).transpose(1, 2)
            inv_freq = 1.0 / torch.pow(theta, torch.arange(0, hd, 2, dtype=torch.float) / hd)
            emb = torch.cat([torch.outer(torch.arange(s, dtype=torch.float), inv_freq)] * 2, -1)
            cos, sin = emb.cos(), emb.sin()
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
            causal = torch.ones(s, s, dtype=torch.bool).triu(1)
            probs = torch.softmax(scores.masked_fill(causal, -1e9), -1)
            return self.o_proj((probs @ v).transpose(1, 2).reshape(bsz, s, -1))

    class SwiGlu(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hid, inter, bias=False)
            self.up_proj = nn.Linear(hid, inter, bias=False)
            self.down_proj = nn.Linear(inter, hid, bias=False)

        def forward(self, t):
            return self.down_proj(F.silu(self.gate_proj(t)) * self.up_proj(t))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(hid, eps=eps), nn.RMSNorm(hid, eps=eps)
            self.self_attn, self.mlp = Attention(), SwiGlu()

        def forward(self, t):
            t = t + self.self_attn(self.input_layernorm(t))
            return t + self.mlp(self.post_attention_layernorm(t))

    xl, wl = torch.randn(2, 128, hid), torch.randn(2, 128, hid)
    for sp in (False, True):
        torch.manual_seed(1)
        act = Shard(1) if sp else Replicate()
        head_norm = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan = {
            "self_attn": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.q_norm": head_norm, "self_attn.k_norm": head_norm,
            "self_attn.o_proj": RowwiseParallel(output_layouts=act),
            "mlp": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=act),
        }
        if sp:
            plan["input_layernorm"] = SequenceParallel(use_local_output=True)
            plan["post_attention_layernorm"] = SequenceParallel(use_local_output=True)
        layer = parallelize_module(DecoderLayer(), mesh, plan)
        xin = xl.chunk(world, 1)[rank] if sp else xl
        win = wl.chunk(world, 1)[rank] if sp else wl

        def layer_step():
            (layer(xin) * win).sum().backward()

        out["step_decoder_layer_sp" if sp else "step_decoder_layer"] = (
            time_us(lambda: (barrier(), layer_step()), 2) / 1000, "ms")

    if rank == 0:
        for name, (value, unit) in out.items():
            print(json.dumps({"name": name, "value": value, "unit": unit}), flush=True)
    # Both ranks done before the group goes: torch 2.15's Gloo aborts a rank that tears its group
    # down while a peer is still in its last collective.
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver

def run_job(cmd, env_extra):
    """Runs a 2-rank job; returns {figure: (value, unit)} from rank 0's JSON lines."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"vs_pytorch: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    figures = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[rank0]: {"):
            d = json.loads(line[len("[rank0]: "):])
            figures[d["name"]] = (d["value"], d["unit"])
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"))
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each side")
    ap.add_argument("--ours-gloo", action="store_true", help="also run our side on Gloo (HP_TRANSPORT=gloo)")
    ap.add_argument("--pytorch-rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pytorch_rank:
        return pytorch_rank()

    import torch
    hprun = os.path.join(args.build, "tools", "hprun", "hprun")
    hp_bench = os.path.join(args.build, "bench", "hp_bench")
    for f in (hprun, hp_bench):
        if not os.access(f, os.X_OK):
            sys.exit(f"vs_pytorch: {f} is missing: build first (scripts/setup.sh)")
    ours_cmd = [hprun, "--nproc-per-node", "2", hp_bench, "--vs-pytorch"]
    pytorch_cmd = [hprun, "--nproc-per-node", "2", sys.executable, os.path.abspath(__file__), "--pytorch-rank"]
    sides = {"ours": [], "pytorch": [], "ours_gloo": []}
    for _ in range(args.rounds):
        sides["ours"].append(run_job(ours_cmd, {}))
        sides["pytorch"].append(run_job(pytorch_cmd, {}))
        if args.ours_gloo:
            sides["ours_gloo"].append(run_job(ours_cmd, {"HP_TRANSPORT": "gloo"}))
    print(json.dumps({"name": "vs_pytorch_environment", "torch": torch.__version__, "rounds": args.rounds,
                      "ranks": 2, "intra_op_threads": 1, "cpus": os.cpu_count()}))
    for figure in sides["pytorch"][0]:
        med = {s: statistics.median(r[figure][0] for r in runs) for s, runs in sides.items() if runs}
        unit = sides["pytorch"][0][figure][1]
        line = {"name": "vs_pytorch_" + figure, "ours": round(med["ours"], 3), "pytorch": round(med["pytorch"], 3),
                "unit": unit, "ratio": round(med["ours"] / med["pytorch"], 4)}
        if "ours_gloo" in med:
            line["ours_gloo"] = round(med["ours_gloo"], 3)
            line["ratio_gloo"] = round(med["ours_gloo"] / med["pytorch"], 4)
        line["target"] = target_of(figure)
        line["met"] = line["ratio"] <= line["target"]
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
