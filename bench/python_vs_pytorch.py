#!/usr/bin/env python3
"""hyper_parallel's Python face against PyTorch's DTensor, both called from Python, in one run.

One 2-rank torchrun job (one intra-op thread per rank) holds both: torch.distributed on Gloo, and
hyper_parallel's runtime keyed into its store. Same shapes and timing protocol as
bench/vs_pytorch.py (medians of alternating repetitions). Prints one JSON line per figure:
- op_overhead_<op>: what a DTensor op adds over the plain op, called from Python, ours and
  PyTorch's; ratio = ours / PyTorch's (goal <= 0.1);
- step_mlp: a Colwise + Rowwise MLP training step (x [256,256], intermediate 768, gelu, SGD)
  parallelized by each library's parallelize_module at tp = 2; ratio = ours / PyTorch's;
- adam_step: torch.optim.Adam(foreach=True) over the DTensor parameters of a [256 -> 1024 -> 256]
  MLP (Colwise, Rowwise), each library's DTensors; adam_overhead: that step less the same Adam on
  plain tensors of the local pieces' shapes (what the DTensors add), ours / PyTorch's;
- qwen3_tp2_step: a transformers Qwen3 training step (hidden 256, 4 layers, 4 x 64 tokens per rank,
  AdamW) under transformers' tp_plan="auto" and under ours (plan_from_transformers);
  qwen3_dp2_fsdp_step: the same under PyTorch's FSDP2 and under our fully_shard (dp = 2);
  qwen3_one_process_step: the same step in one process, for scale; qwen3_dp2_tp2_step (a second,
  4-rank job): transformers' DistributedConfig(tp_size=2, fsdp_size=2) (its tp plan and PyTorch's
  FSDP2) against ours, on dp 2 x tp 2.

    .venv/bin/python bench/python_vs_pytorch.py [--build build]
"""
import argparse
import json
import os
import subprocess
import sys

GOALS = {"op_overhead": 0.1, "adam_overhead": 0.1, "adam_step": 0.8, "step": 0.8, "qwen3": 0.85}


def rank_main():
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Replicate as TR, Shard as TS, distribute_tensor as torch_distribute
    from torch.distributed.tensor.parallel import (ColwiseParallel as TCol, RowwiseParallel as TRow,
                                                   parallelize_module as torch_parallelize)

    import hyper_parallel as hp
    from vs_pytorch import time_pair, time_us

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hp.init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    tmesh = torch_mesh("cpu", (world,), mesh_dim_names=("tp",))
    hmesh = hp.init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out = {}

    torch.manual_seed(0)
    a, b, w, bias = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 16), torch.randn(16)
    lw, lb = torch.randn(16), torch.randn(16)

    def both(dist_fn, mesh, S, R):
        return ([dist_fn(t, mesh, [S]) for t in (a, b)] + [dist_fn(t, mesh, [R]) for t in (w, bias, lw, lb)])

    ours = both(lambda t, m, p: hp.distribute_tensor(t, m, p), hmesh, hp.Shard(0), hp.Replicate())
    theirs = both(torch_distribute, tmesh, TS(0), TR())
    with torch.no_grad():
        cases = {
            "add": lambda t: torch.add(t[0], t[1]),
            "linear": lambda t: F.linear(t[0], t[2], t[3]),
            "layer_norm": lambda t: F.layer_norm(t[0], (16,), t[4], t[5]),
        }
        plain = [a, b, w, bias, lw, lb]
        for op, fn in cases.items():
            p1, o = time_pair(lambda: fn(plain), lambda: fn(ours), 2000)
            p2, t = time_pair(lambda: fn(plain), lambda: fn(theirs), 2000)
            out["op_overhead_" + op] = (o - p1, t - p2, "us")

    h = 256
    layout = (((4 * h, h), 0), ((4 * h,), 0), ((h, 4 * h), 1), ((h,), None))

    def adam_over(make):
        params = []
        for shape, dim in layout:
            prm = nn.Parameter(make(torch.randn(shape), dim))
            prm.grad = make(torch.randn(shape), dim)
            params.append(prm)
        return torch.optim.Adam(params, lr=1e-3, foreach=True).step

    ours_adam = adam_over(lambda t, d: hp.distribute_tensor(t, hmesh, [hp.Replicate() if d is None else hp.Shard(d)]))
    theirs_adam = adam_over(lambda t, d: torch_distribute(t, tmesh, [TR() if d is None else TS(d)]))
    local_adam = adam_over(lambda t, d: t if d is None else t.chunk(world, d)[rank].contiguous())
    p1, o = time_pair(local_adam, ours_adam, 20)
    p2, t = time_pair(local_adam, theirs_adam, 20)
    out["adam_step"] = (o, t, "us")
    out["adam_overhead"] = (o - p1, t - p2, "us")

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(256, 768), nn.Linear(768, 256)

        def forward(self, x):
            return self.down(F.gelu(self.up(x)))

    x, wx = torch.randn(256, 256), torch.randn(256, 256)

    def stepper(parallelize, mesh, col, row):
        torch.manual_seed(0)
        mlp = parallelize(Mlp(), mesh, {"up": col(), "down": row()})
        sgd = torch.optim.SGD(mlp.parameters(), lr=1e-4)

        def step():
            dist.barrier()
            (mlp(x) * wx).sum().backward()
            sgd.step()
            sgd.zero_grad()
        return step

    ours_step = stepper(hp.parallelize_module, hmesh, hp.ColwiseParallel, hp.RowwiseParallel)
    theirs_step = stepper(torch_parallelize, tmesh, TCol, TRow)
    o = [time_us(ours_step, 3, reps=5) / 1000 for _ in range(3)]
    t = [time_us(theirs_step, 3, reps=5) / 1000 for _ in range(3)]
    out["step_mlp"] = (sorted(o)[1], sorted(t)[1], "ms")

    one_process = qwen3_steps(out, hp, hmesh, tmesh, rank)

    if rank == 0:
        print(json.dumps({"name": "python_vs_pytorch_environment", "torch": torch.__version__, "ranks": world,
                          "intra_op_threads": 1, "cpus": os.cpu_count()}), flush=True)
        for name, (ours_v, theirs_v, unit) in out.items():
            goal = next(v for k, v in GOALS.items() if name.startswith(k))
            ratio = ours_v / theirs_v
            print(json.dumps({"name": "python_vs_pytorch_" + name, "ours": round(ours_v, 3), "pytorch": round(theirs_v, 3),
                              "unit": unit, "ratio": round(ratio, 4), "goal": goal, "met": ratio <= goal}), flush=True)
        print(json.dumps({"name": "python_vs_pytorch_qwen3_one_process_step", "value": round(one_process, 3), "unit": "ms"}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def qwen3_checkpoint(rank, tag):
    """A random Qwen3 (hidden 256, 4 layers, vocabulary 1024) that rank 0 saves for every rank to
    load; its directory."""
    import tempfile
    import torch
    import torch.distributed as dist
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=32, tie_word_embeddings=False)
    path = os.path.join(tempfile.gettempdir(), f"hp_bench_qwen3_{tag}_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
    if rank == 0:
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(path)
    dist.barrier()
    return path


def training_step(model, ids):
    """One training step of a transformers causal LM on `ids` (loss, backward, AdamW), as a function."""
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def qwen3_steps(out, hp, hmesh, tmesh, rank):
    """A transformers Qwen3 training step (loss, backward, AdamW) on each rank's 4 x 64 tokens:
    qwen3_tp2_step, transformers' own tensor parallelism (from_pretrained(tp_plan="auto")) against
    ours (its plan through plan_from_transformers); qwen3_dp2_fsdp_step, PyTorch's FSDP2 against
    our fully_shard (per layer, then the root). Returns the same step in one process (ms)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from transformers import Qwen3ForCausalLM
    from vs_pytorch import time_us

    path = qwen3_checkpoint(rank, "tp_dp")
    ids = torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(rank))

    def stepper(model):
        return training_step(model, ids)

    def load(**kwargs):
        return Qwen3ForCausalLM.from_pretrained(path, **kwargs)

    theirs_tp = stepper(load(tp_plan="auto", device_mesh=tmesh))
    ours_model = load()
    hp.parallelize_module(ours_model, hmesh, hp.plan_from_transformers(ours_model))
    ours_tp = stepper(ours_model)
    dp_mesh = hp.init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    ours_model = load()
    for layer in ours_model.model.layers:
        hp.fully_shard(layer, mesh=dp_mesh)
    ours_dp = stepper(hp.fully_shard(ours_model, mesh=dp_mesh))
    theirs_model = load()
    for layer in theirs_model.model.layers:
        torch_fully_shard(layer, mesh=tmesh)
    torch_fully_shard(theirs_model, mesh=tmesh)
    theirs_dp = stepper(theirs_model)
    plain = stepper(load())
    times = {k: [] for k in ("ours_tp", "theirs_tp", "ours_dp", "theirs_dp", "plain")}
    steps = dict(ours_tp=ours_tp, theirs_tp=theirs_tp, ours_dp=ours_dp, theirs_dp=theirs_dp, plain=plain)
    for _ in range(5):  # alternating rounds, medians
        for k, fn in steps.items():
            dist.barrier()
            times[k].append(time_us(fn, 3, 1) / 1000)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    out["qwen3_tp2_step"] = (med["ours_tp"], med["theirs_tp"], "ms")
    out["qwen3_dp2_fsdp_step"] = (med["ours_dp"], med["theirs_dp"], "ms")
    return med["plain"]


def dp_tp_rank_main():
    """The 4-rank job: qwen3_dp2_tp2_step, transformers' own dp x tp (from_pretrained with
    DistributedConfig(tp_size=2, fsdp_size=2): its tp plan and PyTorch's FSDP2) against
    plan_from_transformers plus our fully_shard."""
    import torch
    import torch.distributed as dist
    from transformers import DistributedConfig, Qwen3ForCausalLM

    import hyper_parallel as hp
    from vs_pytorch import time_us

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hp.init_process_group()
    rank = dist.get_rank()
    hmesh = hp.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    path = qwen3_checkpoint(rank, "dp2_tp2")
    ids = torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(hmesh.get_local_rank("dp")))

    def stepper(model):
        return training_step(model, ids)

    # transformers' own dp x tp: its tp plan and its FSDP2 plan from one DistributedConfig.
    theirs = Qwen3ForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))
    ours = Qwen3ForCausalLM.from_pretrained(path)
    hp.parallelize_module(ours, hmesh["tp"], hp.plan_from_transformers(ours))
    for layer in ours.model.layers:
        hp.fully_shard(layer, mesh=hmesh["dp"])
    hp.fully_shard(ours, mesh=hmesh["dp"])
    steps = {"ours": stepper(ours), "theirs": stepper(theirs)}
    times = {k: [] for k in steps}
    for _ in range(5):
        for k, fn in steps.items():
            dist.barrier()
            times[k].append(time_us(fn, 2, 1) / 1000)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    if rank == 0:
        ratio = med["ours"] / med["theirs"]
        print(json.dumps({"name": "python_vs_pytorch_qwen3_dp2_tp2_step", "ours": round(med["ours"], 3),
                          "pytorch": round(med["theirs"], 3), "unit": "ms", "ratio": round(ratio, 4), "goal": GOALS["qwen3"],
                          "met": ratio <= GOALS["qwen3"]}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"))
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dp-tp-rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return rank_main()
    if args.dp_tp_rank:
        return dp_tp_rank_main()
    package = os.path.join(os.path.abspath(args.build), "python")
    if not os.path.isdir(os.path.join(package, "hyper_parallel")):
        sys.exit(f"python_vs_pytorch: {package}/hyper_parallel is missing: build first (scripts/setup.sh)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([package, here]))
    for nproc, flag in (("2", "--rank"), ("4", "--dp-tp-rank")):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", nproc,
               "--local-ranks-filter", "0", os.path.abspath(__file__), flag]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print(line)
        if proc.returncode != 0:
            sys.exit(f"python_vs_pytorch: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


if __name__ == "__main__":
    main()
