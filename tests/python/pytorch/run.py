"""Runs PyTorch's ported tensor-parallel tests on every rank of a torchrun job and gives each test
one verdict: passed only when it passed on every rank.

    torchrun --nproc-per-node 4 tests/python/pytorch/run.py --check          # ours, against the control
    torchrun --nproc-per-node 4 tests/python/pytorch/run.py --control --write control/torch-2.15.json

A job runs the test classes whose world_size is its own (4, or 8 for the mesh tests). With
--control the same files run on PyTorch's own DTensor (the shim in _control/ answers their
`from hyper_parallel import ...`); --write merges the verdicts into a JSON file, --check compares
ours with the control's verdicts of this torch version: every test the control passes must pass,
except those expected.py lists with their reason (which must still fail, so the list stays true).
"""
import argparse
import datetime
import importlib
import inspect
import json
import os
import re
import sys
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ["test_tp_style", "test_parallelize_api", "test_tp_examples", "test_tp_random_state", "test_dtensor",
           "test_redistribute"]


def torch_minor():
    import torch
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def control_path():
    return os.path.join(HERE, "control", f"torch-{torch_minor()}.json")


def collect(world_size, pattern):
    """(test id, TestCase instance) for every test of a class of this world size, in file order."""
    import _harness
    loader = unittest.TestLoader()
    tests = []
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, _harness.DTensorTestBase):
                continue
            for method in loader.getTestCaseNames(cls):
                case = cls(method)
                if case.world_size != world_size:
                    continue
                test_id = f"{name}.{cls.__name__}.{method}"
                if pattern and pattern not in test_id:
                    continue
                tests.append((test_id, case))
    return tests


def verdict_of(result, verbose=False):
    """'passed', 'skipped: why' or 'failed: the last line of the first error' for one rank."""
    problems = result.errors + result.failures
    if problems and verbose:
        print(problems[0][1], file=sys.stderr, flush=True)
    if problems:
        lines = [line.strip() for line in problems[0][1].strip().splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
        return "failed: " + (raised[-1] if raised else lines[-1] if lines else "?")[:400]
    if result.skipped:
        return "skipped: " + str(result.skipped[0][1])[:200]
    if result.unexpectedSuccesses:
        return "failed: unexpected success"
    return "passed"


def run_one(case, control, store, index, rank, world_size, verbose):
    if not control:
        from hyper_parallel import _C
        # A fresh runtime per test, as PyTorch's with_comms gives each test a fresh process group:
        # a test that left peers behind (a failed collective) cannot touch the next one.
        import torch.distributed as dist
        _C._init_process_group_with_store(dist.PrefixStore(f"hp_pytorch_tests/{index}/", store), rank,
                                          world_size, "cpu")
    result = unittest.TestResult()
    try:
        case.run(result)
    except BaseException:  # noqa: BLE001 - a verdict, whatever the test raised
        result.errors.append((case, traceback.format_exc()))
    finally:
        if not control:
            _C._destroy_process_group()
    return verdict_of(result, verbose)


def combine(per_rank):
    """One verdict from every rank's."""
    if all(v == "passed" for v in per_rank):
        return "passed"
    if all(v.startswith("skipped") for v in per_rank):
        return per_rank[0]
    failed = [(r, v) for r, v in enumerate(per_rank) if v != "passed"]
    return "failed: " + "; ".join(f"rank {r}: {v}" for r, v in failed[:2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", action="store_true", help="run on PyTorch's own DTensor")
    parser.add_argument("--write", help="merge the verdicts into this JSON file (rank 0)")
    parser.add_argument("--check", action="store_true", help="compare with the control's verdicts")
    parser.add_argument("-k", default="", help="only tests whose id contains this")
    parser.add_argument("-v", action="store_true", help="print rank 0's traceback of each failure")
    args = parser.parse_args()

    # One line per failure, not PyTorch's repro hint.
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    if args.control:
        sys.path.insert(0, os.path.join(HERE, "_control"))
    sys.path.insert(0, HERE)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # Longer than hyper_parallel's collective timeout (HP_TIMEOUT_S), so that a rank stuck in a test
    # gives up there before the verdicts are exchanged here.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()

    tests = collect(world_size, args.k)
    verdicts = {}
    for index, (test_id, case) in enumerate(tests):
        mine = run_one(case, args.control, store, index, rank, world_size, args.v and rank == 0)
        every = [None] * world_size
        dist.all_gather_object(every, mine)
        verdicts[test_id] = combine(every)
        if rank == 0:
            print(f"{verdicts[test_id][:160]:<60}  {test_id}", flush=True)

    status = 0
    if rank == 0:
        passed = sum(v == "passed" for v in verdicts.values())
        side = "PyTorch (control)" if args.control else "hyper_parallel"
        print(f"\n{side}, torch {torch.__version__}, world size {world_size}: {passed} of {len(verdicts)} passed")
        if args.write:
            merged = {}
            if os.path.exists(args.write):
                with open(args.write) as f:
                    merged = json.load(f)
            merged.update(verdicts)
            with open(args.write, "w") as f:
                json.dump(dict(sorted(merged.items())), f, indent=1)
                f.write("\n")
        if args.check:
            status = check(verdicts)
    statuses = [None] * world_size
    dist.all_gather_object(statuses, status)
    dist.destroy_process_group()
    return max(statuses)


def check(verdicts):
    """0 when every test the control passes passes here, or fails as expected.py says it must."""
    import expected
    with open(control_path()) as f:
        control = json.load(f)
    counted = [t for t in verdicts if control.get(t) == "passed"]
    bad = []
    for t in counted:
        ours = verdicts[t]
        if t in expected.EXCEPTIONS:
            if ours == "passed":
                bad.append(f"{t}: passes, but expected.py still lists it as an exception; remove it there and in README.md")
        elif ours != "passed":
            bad.append(f"{t}: {ours}")
    missing = [t for t in verdicts if t not in control]
    for t in missing:
        bad.append(f"{t}: no control verdict in {os.path.relpath(control_path(), HERE)}; run the control (README.md)")
    with open(os.path.join(HERE, "README.md")) as f:
        readme = f.read()
    for t in expected.EXCEPTIONS:
        if t.split(".", 1)[1] not in readme:
            bad.append(f"{t}: listed in expected.py but not in README.md")
    ok = sum(verdicts[t] == "passed" for t in counted)
    print(f"counted (passed by the control): {len(counted)}; passed here: {ok}; "
          f"listed exceptions: {sum(t in expected.EXCEPTIONS for t in counted)}")
    for line in bad:
        print("MISMATCH " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    code = main()
    # Out without the interpreter's finalization: a Gloo worker thread of torch's process group
    # may still drop the last reference to a tensor of the verdict exchange then, and one that
    # takes the GIL while Python finalizes is ended by pthread_exit through a noexcept frame
    # (std::terminate, seen about one job in four at 8 ranks).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
