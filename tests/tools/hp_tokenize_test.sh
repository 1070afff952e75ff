#!/usr/bin/env bash
# hp_tokenize against the tokenizers library: a JSON-lines corpus in many scripts and a text file,
# tokenized with Qwen3.5's real vocabulary, hold tokenizers' ids of every document followed by EOS;
# the file is the same at 1 and 4 threads; bad inputs are refused naming the file and line.
set -u
TOOL=$1
TOKDIR=$2
PY=$3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$PY" - "$W" <<'PY'
import json, random, sys
w = sys.argv[1]
random.seed(5)
words = ["Hello", "wörld", "你好", "世界", "🤗", "über", "третий", "документ", "naïve", "café", "مرحبا", "こんにちは",
         "  spaces  ", "\n", "\t", "1234", "3.14159", "<|im_start|>", "don't", "—", "😀😃", "ﬁ", "e\u0301"]
with open(f"{w}/corpus.jsonl", "w", encoding="utf-8") as f:
    for i in range(400):
        f.write(json.dumps({"id": i, "text": " ".join(random.choice(words) for _ in range(random.randint(1, 60)))}, ensure_ascii=i % 2 == 0) + "\n")
with open(f"{w}/book.txt", "w", encoding="utf-8") as f:
    f.write("A plain text file is one document.\nЕго вторая строка. 第二行。\n")
PY
"$TOOL" --tokenizer "$TOKDIR" --output "$W/one.tokens" --threads 1 "$W/corpus.jsonl" "$W/book.txt" || fail "1 thread exited $?"
"$TOOL" --tokenizer "$TOKDIR" --output "$W/four.tokens" --threads 4 "$W/corpus.jsonl" "$W/book.txt" >"$W/out" || fail "4 threads exited $?"
cat "$W/out"
cmp -s "$W/one.tokens" "$W/four.tokens" || fail "the file differs between 1 and 4 threads"
"$PY" - "$W" "$TOKDIR/tokenizer.json" <<'PY' || fail "ids differ from the tokenizers library's"
import json, struct, sys
import numpy as np
from tokenizers import Tokenizer
w, tj = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(tj)
raw = open(f"{w}/one.tokens", "rb").read()
magic, width, vocab, n, eos, docs, maxid = struct.unpack("<8sQQQqQQ", raw[:56])
assert magic == b"HPTOKEN1", magic
assert width == (2 if vocab <= 65535 else 4) and width == 4, (width, vocab)
ids = np.frombuffer(raw[64:], dtype=np.uint32 if width == 4 else np.uint16).astype(np.int64)
assert len(ids) == n, (len(ids), n)
want = []
texts = [json.loads(l)["text"] for l in open(f"{w}/corpus.jsonl", encoding="utf-8")]
texts.append(open(f"{w}/book.txt", encoding="utf-8").read())
for t in texts:
    want += tok.encode(t, add_special_tokens=False).ids + [eos]
assert docs == len(texts), (docs, len(texts))
assert eos == tok.token_to_id("<|endoftext|>")
assert list(ids) == want, next(i for i, (a, b) in enumerate(zip(ids, want)) if a != b)
assert maxid == max(want)
print(f"hp_tokenize: {len(texts)} documents, {n} tokens: the tokenizers library's ids plus EOS")
PY
# Bad inputs: named, exit status 1 (data) or 2 (flags), and no output file left behind.
printf '{"text": "fine"}\n{"text": broken}\n' >"$W/bad.jsonl"
"$TOOL" --tokenizer "$TOKDIR" --output "$W/bad.tokens" "$W/bad.jsonl" >"$W/err" 2>&1
[ $? -eq 1 ] && grep -q "bad.jsonl:2: not JSON" "$W/err" || { cat "$W/err"; fail "a bad JSON line is not named"; }
printf '{"body": "no text"}\n' >"$W/nofield.jsonl"
"$TOOL" --tokenizer "$TOKDIR" --output "$W/bad.tokens" "$W/nofield.jsonl" >"$W/err" 2>&1
[ $? -eq 1 ] && grep -q "nofield.jsonl:1: not an object with a string field 'text'" "$W/err" || { cat "$W/err"; fail "a missing field is not named"; }
[ ! -e "$W/bad.tokens" ] && [ ! -e "$W/bad.tokens.tmp" ] || fail "a failed run left a file"
"$TOOL" --tokenizer "$TOKDIR" --output "$W/x.tokens" --eos "<nope>" "$W/book.txt" >"$W/err" 2>&1
[ $? -eq 2 ] && grep -q "the tokenizer has no token '<nope>'" "$W/err" || { cat "$W/err"; fail "an unknown EOS is not refused"; }
echo "hp_tokenize tests passed"
