#!/bin/sh
# t-route.sh - routing finds structure, and a DiPaCo run is re-sharded by it (EM, paper 2.4).
#
# A labelled corpus of three "genres" with disjoint byte statistics (digit groups, uppercase
# words, lowercase prose; each JSONL document has a "category"), cut into 64-token pieces,
# and a base model (configs/gpt-small-test.yaml) trained 400 steps on it. Then, each result
# recomputed by a Python reader of the token, features and router files (numpy, struct, json,
# zlib: nothing from the C code):
#   1. dpc-route features (prefix 8) + kmeans -k 3 + dpc-shard split --router --features: every
#      document in exactly one shard, the shards a permutation of the input (tokens and
#      metadata, input order kept), each document in its nearest centroid's shard, the manifest
#      and report counts, purity > 0.9 and above the random-shards baseline, and the
#      label-by-shard table (JSON report and stderr text) equal to a count of the shards;
#   2. --top 2: each document in its two nearest shards, "top": 2, the report's pairs;
#   3. -m BASE instead of --features: byte-identical shards and manifest;
#   4. a 2x2 run (4 paths, 2 phases) on k-means shards (k = 4), dipaco-train.sh --until 1,
#      phase 2 not trained; score phase 1 on the router split, fit a logreg router, re-shard
#      train.tok into RUN/phase-0001/shards (each document at the argmax of the router's logits),
#      finish the run: phase 1 checkpoints record the old shards' tokens, phase 2 the new ones',
#      the shards differ, and the Makefile's phase-2 rules name phase-0001/shards;
#   5. dpc-route eval with a window router of W = 16 and one of W = 200 (longer than every
#      validation document): one table row per mode, equal token counts (= the tokens past the
#      prefix, counted here), and W = 200 gives exactly the once-per-document loss; then
#      --score-from on documents of 5, 40 and 70 tokens against counts made by hand.
# (The numbers of features, score and eval are checked against PyTorch in t-route-torch.sh.)
# Checks that fail because of a known bug in the programs are collected and reported at the
# end, after every other check has run.
set -eu
. "$TESTDIR/lib.sh"

PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
CFG=$ROOT/configs/gpt-small-test.yaml
"$PY" -c 'import numpy' 2>/dev/null || skip "skipped: $PY cannot import numpy"
for p in dpc-route dpc-shard dpc-train-path dpc-outer; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
# One thread each: OpenMP threads that wait on busy cores make these tiny models crawl.
export OMP_NUM_THREADS=1
bug=""
known() { echo "KNOWN BUG: $*"; bug="$bug; $*"; }

# ---- the independent reader and checks --------------------------------------------------
cat >rt.py <<'EOF'
"""Readers of token files (dpc-tokens(5)) and safetensors files, and the checks of
t-route.sh; numpy, struct, json and zlib only."""
import json, os, re, struct, sys, zlib
import numpy as np

def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)

def tok(path):
    """The documents of a token file: [(tokens as int64 bytes, metadata bytes)]."""
    raw = open(path, "rb").read()
    if raw[:8] != b"DPCTOKS\0":
        fail(path + ": not a token file")
    _, _, nd, nt, width, crc, mb = struct.unpack_from("<IIQQIIQ", raw, 8)
    if zlib.crc32(raw[64:]) != crc:
        fail(path + ": body crc32 differs from the header's (reader out of date?)")
    off = 64
    toks = np.frombuffer(raw, {2: "<u2", 4: "<u4"}[width], nt, off).astype(np.int64)
    off += (nt * width + 7) // 8 * 8
    offs = np.frombuffer(raw, "<u8", nd + 1, off).astype(np.int64)
    off += 8 * (nd + 1)
    moffs = np.frombuffer(raw, "<u8", nd + 1, off).astype(np.int64)
    off += 8 * (nd + 1)
    meta = raw[off:]
    if len(meta) != mb:
        fail(path + ": file length does not match the header")
    return [(toks[offs[d]:offs[d + 1]].tobytes(), meta[moffs[d]:moffs[d + 1]])
            for d in range(nd)]

def ntok(doc):
    return len(doc[0]) // 8

def st(path):
    """(tensors as float64 arrays, metadata) of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    ts = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        dt = {"F32": "<f4", "I32": "<i4", "I64": "<i8"}[v["dtype"]]
        ts[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dt).astype(np.float64).reshape(v["shape"])
    return ts, meta

def route_scores(router, X):
    """Per document and path, a score whose maximum is the router's choice, from the
    router's tensors (dpc-route(5)): minus the squared distance to each centroid, or the
    logits of the standardised features plus the bias correction."""
    ts, meta = st(router)
    if meta["kind"] == "kmeans":
        C = ts["centroids"]
        return -((X[:, None, :] - C[None, :, :]) ** 2).sum(-1), int(meta["paths"])
    Z = (X - ts["mean"]) / ts["std"]
    return Z @ ts["weight"].T + ts["bias"] + ts["correction"], int(meta["paths"])

def label(doc):
    return json.loads(doc[1])["category"]

def check_split(inp, outdir, features, router, stdout, stderr, top, min_purity="0.9"):
    """Shards of a routed split against the input, the features and the router."""
    top, min_purity = int(top), float(min_purity)
    docs = tok(inp)
    man = json.load(open(os.path.join(outdir, "shards.json")))
    files = [s["file"] for s in man["shards"]]
    S = man["paths"]
    have = sorted(os.listdir(outdir))
    if have != sorted(files + ["shards.json"]):
        fail("%s holds %s, the manifest names %s" % (outdir, have, files))
    if man.get("top", 1) != top:
        fail("manifest top %s, expected %d" % (man.get("top"), top))
    index = {}
    for d, doc in enumerate(docs):
        if doc in index:
            fail("%s: documents %d and %d are identical (the test needs them distinct)"
                 % (inp, index[doc], d))
        index[doc] = d
    where = [[] for _ in docs]
    for s, f in enumerate(files):
        prev, n, t = -1, 0, 0
        for doc in tok(os.path.join(outdir, f)):
            d = index.get(doc)
            if d is None:
                fail("%s/%s holds a document (tokens + metadata) that is not in %s"
                     % (outdir, f, inp))
            if d <= prev:
                fail("%s/%s: input document %d after %d (order not kept, or twice)"
                     % (outdir, f, d, prev))
            prev = d
            where[d].append(s)
            n, t = n + 1, t + ntok(doc)
        m = man["shards"][s]
        if (m["docs"], m["tokens"]) != (n, t):
            fail("manifest says shard %d has %d docs %d tokens, it has %d %d"
                 % (s, m["docs"], m["tokens"], n, t))
    bad = [d for d in range(len(docs)) if len(where[d]) != top]
    if bad:
        fail("%d documents are not in exactly %d shard(s), e.g. document %d in %s"
             % (len(bad), top, bad[0], where[bad[0]]))
    # each document's shards: the router's best `top` paths from its feature row
    ft, fm = st(features)
    X = ft["features"]
    if X.shape[0] != len(docs) or int(fm["docs"]) != len(docs):
        fail("%s has %d rows, %s %d documents" % (features, X.shape[0], inp, len(docs)))
    sc, P = route_scores(router, X)
    if P != S:
        fail("router has %d paths, the split %d shards" % (P, S))
    order = np.argsort(-sc, axis=1, kind="stable")
    ties = 0
    for d in range(len(docs)):
        want = sorted(order[d, :top].tolist())
        if sorted(where[d]) == want:
            continue
        srt = -np.sort(-sc[d])
        if abs(srt[top - 1] - srt[top]) <= 1e-4 * (1 + abs(srt[top])):
            ties += 1
            continue
        fail("document %d is in shard(s) %s, its best %d path(s) are %s (scores %s)"
             % (d, where[d], top, want, np.round(sc[d], 5).tolist()))
    first = order[:, 0]
    # the report: on stdout with the manifest, and as text on stderr
    out = json.loads(open(stdout).read())
    rep = out.pop("report")
    if out != man:
        fail("the manifest on stdout differs from shards.json")
    if (rep["paths"], rep["top"], rep["docs"]) != (S, top, len(docs)):
        fail("report paths/top/docs %s %s %s" % (rep["paths"], rep["top"], rep["docs"]))
    if [[r["docs"], r["tokens"]] for r in rep["shards"]] != \
       [[s["docs"], s["tokens"]] for s in man["shards"]]:
        fail("report shard sizes differ from the manifest's")
    if top == 2:
        pairs = {}
        for d in range(len(docs)):
            a, b = sorted(where[d])
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
        got = {tuple(p["shards"]): p["docs"] for p in rep["pairs"]}
        if got != pairs:
            fail("report pairs %s, counted %s" % (sorted(got.items()), sorted(pairs.items())))
        print("pairs of shards: %s" % sorted(pairs.items()))
    elif rep["pairs"]:
        fail("top 1 with pairs %s" % rep["pairs"])
    # the label-by-shard table of the first choices
    names = sorted({label(doc) for doc in docs})
    table = {(g, s): 0 for g in names for s in range(S)}
    for d, doc in enumerate(docs):
        s = where[d][0] if top == 1 else int(first[d])
        table[(label(doc), s)] += 1
    lab = rep["labels"]
    if lab is None or lab["label"] != "category" or sorted(lab["labels"]) != names:
        fail("report labels %s, the documents have categories %s" % (lab, names))
    for i, g in enumerate(lab["labels"]):
        row = [table[(g, s)] for s in range(S)]
        if lab["table"][i] != row:
            fail("report row '%s' is %s, counted %s" % (g, lab["table"][i], row))
    purity = sum(max(table[(g, s)] for g in names) for s in range(S)) / len(docs)
    if abs(lab["purity"] - purity) > 1e-6:
        fail("report purity %.6f, counted %.6f" % (lab["purity"], purity))
    rnd = lab["random_shards"]["purity_mean"]
    if not purity > min_purity:
        fail("purity %.4f, expected > %g (the genres are trivially separable)"
             % (purity, min_purity))
    if not purity > rnd + 0.1:
        fail("purity %.4f is not above random shards' %.4f" % (purity, rnd))
    text = open(stderr).read().splitlines()
    hdr = [i for i, l in enumerate(text) if re.match(r"^\s+category(\s+\d+)+\s*$", l)]
    if len(hdr) != 1:
        fail("no label table header in the stderr report:\n" + "\n".join(text))
    for line in text[hdr[0] + 1:hdr[0] + 1 + len(names)]:
        w = line.split()
        if w[0] not in names or [int(x) for x in w[1:]] != [table[(w[0], s)] for s in range(S)]:
            fail("stderr row '%s', counted %s" % (line, [table[(w[0], s)] for s in range(S)]
                                                  if w[0] in names else "no such label"))
    m = [re.search(r"purity ([0-9.]+) \(random shards of these sizes ([0-9.]+)", l) for l in text]
    m = [x for x in m if x]
    if len(m) != 1 or abs(float(m[0].group(1)) - purity) > 6e-5:
        fail("stderr purity line missing or not %.4f:\n%s" % (purity, "\n".join(text)))
    print("split top %d: %d documents into %d shards, all at the router's choice (%d near-ties), "
          "purity %.4f (random %.4f)" % (top, len(docs), S, ties, purity, rnd))

def check_ckpt_shards(run, phase, sdir):
    """Each path checkpoint of the phase records the tokens of its shard in sdir."""
    man = json.load(open(os.path.join(sdir, "shards.json")))
    for p, s in enumerate(man["shards"]):
        n = sum(ntok(d) for d in tok(os.path.join(sdir, s["file"])))
        ck = os.path.join(run, "phase-%04d" % int(phase), "paths", "path-%03d.safetensors" % p)
        got = int(st(ck)[1]["shard_tokens"])
        if not got == n == s["tokens"]:
            fail("%s: shard_tokens %d, but %s/%s has %d tokens (manifest %d)"
                 % (ck, got, sdir, s["file"], n, s["tokens"]))
    print("phase %s: every path checkpoint trained on its shard of %s" % (phase, sdir))

def check_differ(a, b):
    ma = json.load(open(os.path.join(a, "shards.json")))
    mb = json.load(open(os.path.join(b, "shards.json")))
    diff = [p for p, (x, y) in enumerate(zip(ma["shards"], mb["shards"]))
            if tok(os.path.join(a, x["file"])) != tok(os.path.join(b, y["file"]))]
    if not diff:
        fail("the re-sharded run has the same shards as before: EM moved nothing")
    print("re-sharding changed the shards of paths %s" % diff)

def check_eval(ejson, table, val, prefix, bigw):
    prefix, bigw = int(prefix), int(bigw)
    e = json.load(open(ejson))
    docs = tok(val)
    want = sum(max(0, ntok(d) - prefix) for d in docs)
    longest = max(ntok(d) for d in docs)
    if longest >= bigw:
        fail("a validation document has %d tokens: W = %d must exceed them" % (longest, bigw))
    modes = e["modes"]
    if (e["docs"], e["prefix"]) != (len(docs), prefix):
        fail("eval docs/prefix %s %s" % (e["docs"], e["prefix"]))
    toks = [m["tokens"] for m in modes]
    if toks != [want] * len(modes):
        fail("tokens scored per mode %s, expected %d each (past the prefix)" % (toks, want))
    if [m["window"] for m in modes] != [0, 16, bigw]:
        fail("modes %s" % [m["window"] for m in modes])
    doc, big = modes[0], modes[2]
    if big["loss"] != doc["loss"] or big["switches"] != 0:
        fail("W = %d (longer than every document): loss %r, %d switches; once per document %r"
             % (bigw, big["loss"], big["switches"], doc["loss"]))
    rows = [l.split() for l in open(table).read().splitlines()]
    names = ["once per document", "every 16 tokens", "every %d tokens" % bigw]
    got = [r for r in rows if " ".join(r[:3]) in names]
    if [" ".join(r[:3]) for r in got] != names:
        fail("the table's rows are %s, expected one per mode %s" % (rows, names))
    if got[0][4] != got[2][4] or int(got[0][5]) != want:
        fail("table: loss %s vs %s, tokens %s" % (got[0][4], got[2][4], got[0][5]))
    print("eval: %d tokens in every mode; W = %d gives the once-per-document loss %r"
          % (want, bigw, doc["loss"]))

def check_lengths(path, *want):
    n = sorted(ntok(d) for d in tok(path))
    if n != sorted(int(w) for w in want):
        fail("%s holds documents of %s tokens, expected %s" % (path, n, list(want)))

{"split": check_split, "ckpt-shards": check_ckpt_shards, "differ": check_differ,
 "eval": check_eval, "lengths": check_lengths}[sys.argv[1]](*sys.argv[2:])
EOF
rt() { "$PY" rt.py "$@" || die "the check '$1' failed (above)"; }

# ---- the corpus and the base model ----------------------------------------------------
"$PY" "$TESTDIR/genres.py" c.jsonl 120 --ids
expect_ok "$BIN/dpc-shard" prepare --chunk 64 --val-frac 0.1 --router-frac 0.2 c.jsonl d
# whole documents (150 to 400 tokens) for the long window router
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 c.jsonl long
t0=$(date +%s)
expect_ok "$BIN/dpc-train-path" -c "$CFG" -s train.steps=400 -s train.warmup_steps=5 \
	-s train.lr=1e-2 -s train.eval_every=0 -s train.checkpoint_every=0 -t 1 -q \
	-d d/train.tok -o base.safetensors
echo "base model: 400 steps in $(($(date +%s) - t0)) s"

route() { expect_ok "$BIN/dpc-route" "$@" -q; }
route features -m base.safetensors --prefix 8 -o F.st d/train.tok
route features -m base.safetensors --prefix 8 -o Fr.st d/router.tok
route kmeans -k 3 -o K3.st F.st

# ---- 1. k-means shards, top 1 -----------------------------------------------------------
expect_ok "$BIN/dpc-shard" split --router K3.st --features F.st d/train.tok s1
cp out.stdout s1.stdout
cp out.stderr s1.stderr
sed 's/^/    /' s1.stderr
rt split d/train.tok s1 F.st K3.st s1.stdout s1.stderr 1

# ---- 2. top 2 ---------------------------------------------------------------------------
expect_ok "$BIN/dpc-shard" split --router K3.st --features F.st --top 2 d/train.tok s2
cp out.stdout s2.stdout
cp out.stderr s2.stderr
grep -q '"top": 2' s2/shards.json || die "the top-2 manifest does not say \"top\": 2"
rt split d/train.tok s2 F.st K3.st s2.stdout s2.stderr 2

# ---- 3. features computed from the base: the same shards --------------------------------
expect_ok "$BIN/dpc-shard" split -q --router K3.st -m base.safetensors -t 1 d/train.tok s3
for f in s1/*; do same_file "$f" "s3/${f#s1/}"; done
[ "$(find s3 -type f | wc -l)" = "$(find s1 -type f | wc -l)" ] || die "s3 holds other files than s1"
echo "-m BASE and --features: byte-identical shards and manifest"

# ---- 4. EM: a run re-sharded after phase 1 ----------------------------------------------
cat >run.yaml <<'EOF'
model:
  n_layer: 2
  n_embd: 32
  n_head: 2
  seq_len: 32
  vocab_size: 256
train:
  batch_size: 4
  steps: 40
  lr: 1.0e-2
  warmup_steps: 2
  eval_every: 0
  eval_batches: 1
  checkpoint_every: 0
  seed: 1
dipaco:
  phases: 2
  inner_steps: 20
levels:
  - name: lower
    owns: embed h.0
    modules: 2
  - name: upper
    owns: h.1 head
    modules: 2
EOF
# four paths on three genres: k-means splits one genre in two, which EM then redraws
route kmeans -k 4 -o K4.st F.st
mkdir R
expect_ok "$BIN/dpc-shard" split -q --router K4.st --features F.st d/train.tok R/shards
train_run() {
	sh "$ROOT/scripts/dipaco-train.sh" -q --bin "$BIN" -j 2 "$@" run.yaml R d/train.tok \
		d/val.tok >train.out 2>train.err || { cat train.err; die "dipaco-train.sh $* failed"; }
}
train_run --until 1
n1=$(find R/phase-0001 -name "*.safetensors" | wc -l)
[ "$n1" = 8 ] || die "after --until 1, phase 1 has $n1 of 8 checkpoints"
left=$(find R -path 'R/phase-0002/*' -type f)
[ -z "$left" ] || die "dipaco-train.sh --until 1 trained phase 2: $left"
echo "dipaco-train.sh --until 1: phase 1 trained, phase 2 not"
route score --run R --phase 1 --prefix 8 -o S.st d/router.tok
route fit --scores S.st --features Fr.st -o LR.st d/router.tok
expect_ok "$BIN/dpc-shard" split --router LR.st --features F.st d/train.tok R/phase-0001/shards
cp out.stdout lr.stdout
cp out.stderr lr.stderr
# (4 paths for 3 genres, the best path per document after 20 steps: looser than k-means)
rt split d/train.tok R/phase-0001/shards F.st LR.st lr.stdout lr.stderr 1 0.7
train_run
n2=$(find R/phase-0002 -name "*.safetensors" | wc -l)
[ "$n2" = 8 ] || die "the resumed run has $n2 of 8 phase-2 checkpoints"
rt ckpt-shards R 1 R/shards
rt ckpt-shards R 2 R/phase-0001/shards
rt differ R/shards R/phase-0001/shards
# The same command again, with its progress lines: nothing left to do, exit 0, nothing changed.
find R -type f | LC_ALL=C sort | xargs cksum >R.before
sh "$ROOT/scripts/dipaco-train.sh" --bin "$BIN" -j 2 run.yaml R d/train.tok d/val.tok \
	>again.out 2>again.err && rc=0 || rc=$?
find R -type f | LC_ALL=C sort | xargs cksum >R.after
cmp -s R.before R.after || { diff R.before R.after; die "rerunning a finished run changed it"; }
if [ "$rc" -ne 0 ]; then
	sed 's/^/    /' again.err
	known "sh scripts/dipaco-train.sh without -q exits $rc after a successful run (here" \
		"one with nothing left to do), expected 0: its EXIT trap kills the progress" \
		"watcher already killed and waited, and under set -e dash exits with that" \
		"kill's failure"
fi
# The task graph: phase 2 trains on the new shards, so its rules depend on them.
mk_bad=""
for p in 000 001 002 003; do
	rule=$(grep "^phase-0002/paths/path-$p\.safetensors:" R/Makefile) ||
		die "R/Makefile has no rule for phase 2 path $p"
	case " $rule " in
	*" phase-0001/shards/shard-$p.tok "*) ;;
	*) mk_bad="$mk_bad $p" ;;
	esac
done
if [ -n "$mk_bad" ]; then
	grep "^phase-0002/paths/path-000" R/Makefile | sed 's/^/    /'
	known "R/Makefile (written by dpc-outer init run from outside R, as dipaco-train.sh does):" \
		"the phase-2 rules of paths$mk_bad depend on shards/shard-NNN.tok, not on" \
		"phase-0001/shards/shard-NNN.tok that phase 2 trains on (plan.c checks the" \
		"re-shard folder relative to the current directory)"
else
	echo "R/Makefile: phase 2 trains on phase-0001/shards"
fi

# ---- 5. eval with window routers --------------------------------------------------------
route fit --scores S.st --window 16 -m base.safetensors -o W16.st d/router.tok
route score --run R --phase 1 --prefix 8 -o SL.st long/train.tok
route fit --scores SL.st --window 200 -m base.safetensors -o W200.st long/train.tok
expect_ok "$BIN/dpc-route" eval -q --run R -m base.safetensors --router LR.st \
	--window-router W16.st --window-router W200.st --json E.json d/val.tok
cp out.stdout E.txt
sed 's/^/    /' E.txt
rt eval E.json E.txt d/val.tok 8 200

# ---- 5b. the scored positions, counted by hand ------------------------------------------
# Three documents of 5, 40 and 70 bytes. The base model alone (one path, no router) scores
# from its default prefix 32: 8 + 38 = 46 tokens; with --score-from 10: 30 + 60 = 90, as
# many as the routed run (prefix 8) scores with the same --score-from; --score-from 1: 4 +
# 39 + 69 = 112. Scoring before a router's prefix is refused.
"$PY" -c '
import json
for n, c in ((5, "a"), (40, "b"), (70, "c")):
    print(json.dumps({"text": c * n}))' >tiny.jsonl
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 tiny.jsonl tiny
rt lengths tiny/train.tok 5 40 70
scored() {
	want=$1
	shift
	expect_ok "$BIN/dpc-route" eval -q -m base.safetensors --json T.json "$@" tiny/train.tok
	got=$("$PY" -c 'import json; e = json.load(open("T.json")); print(" ".join(str(m["tokens"]) for m in e["modes"]), e["tokens"], e["score_from"])')
	[ "$got" = "$want" ] || die "eval $*: scored (per mode, in all, from) '$got', expected '$want'"
}
scored "46 46 32" --path base.safetensors
scored "90 90 10" --path base.safetensors --score-from 10
scored "112 112 1" --path base.safetensors --score-from 1
scored "90 90 10" --run R --router LR.st --score-from 10
expect_fail 2 "^dpc-route: eval: --score-from 4 is before the router's prefix 8: the tokens the router reads are not scored$" \
	"$BIN/dpc-route" eval -q --run R -m base.safetensors --router LR.st --score-from 4 tiny/train.tok
echo "eval scores 46, 90 and 112 tokens of 5 + 40 + 70 from positions 32, 10 and 1, as counted by hand"

# ---- 6. sampling from the routed run ----------------------------------------------------
# With the key/value cache (a switch feeds the context to the new path) the text is the
# text of a full forward per token; the path switches where eval, routing the same text as
# a document (its window features over the whole document), switches.
"$BIN/dpc-shard" cat --doc 0 d/val.tok | head -c 24 >prompt.txt
smp() { # ROUTER [options]: 400 tokens after the prompt, re-routed by window router ROUTER
	w=$1
	shift
	"$BIN/dpc-route" sample --run R -m base.safetensors --router LR.st --window-router "$w" \
		-n 400 "$@" - <prompt.txt
}
# A window router made so that the text must switch path (a fitted one switches rarely here:
# eval finds 0.06 switches per document at W = 16, and whether the sample meets one hangs on
# the rounding of the kernel that ran). Sampling is stateless (each draw from the seed and
# the position), so a constant router to the path A the document router gives the prompt
# yields a text T_A that any router deciding A at each boundary reproduces. (A is the
# document router's: eval scores the text's first window with that path and counts a
# switch where the window router leaves it, which sample, whose text starts after the
# prompt, does not count.) On T_A's window
# features (the independent reference's, test/ref/route_torch.py), the router picks a
# feature j and the widest gap between its values at the boundaries: B when z_j is above
# the gap's middle, A below. Some boundary lies above, so the sample switches there: the
# text up to it is T_A's, whose features put it above, with the gap's half as the margin.
if ! "$PY" -c 'import torch' 2>/dev/null; then
	echo "sampling checks skipped: $PY cannot import torch (the reference's features)"
	[ -z "$bug" ] || die "known bugs (every other check passed):${bug#;}"
	echo "ok"
	exit 0
fi
cat >gap.py <<'EOF2'
import sys
import numpy as np

def widest_gap(z):
    """z [boundaries, features]: the feature j and threshold theta (the middle of the widest
    gap between its values at the boundaries, above its value at the first) that put the
    first boundary below and some later one above, and the gap's width."""
    best = (-1.0, 0, 0.0)
    for j in range(z.shape[1]):
        v = np.sort(z[1:, j])
        v = v[v > z[0, j]]
        if v.size == 0:
            continue
        v = np.concatenate([[z[0, j]], v])
        g = np.diff(v)
        k = int(np.argmax(g))
        if g[k] > best[0]:
            best = (float(g[k]), j, float(v[k] + g[k] / 2))
    if best[0] <= 0:
        sys.exit("no feature rises above its value at the first boundary")
    return best
EOF2
cat >mkwin.py <<'EOF2'
import sys
import numpy as np
from gap import widest_gap
sys.path.insert(0, sys.argv[1])
import gpt2_torch as g2
import route_torch as rt
mode, src, out, a = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
t, meta = g2.st_read(src)
P, D = t["weight"].shape
t = dict(t)
t["mean"], t["std"] = np.zeros(D, np.float32), np.ones(D, np.float32)
t["weight"], t["correction"] = np.zeros((P, D), np.float32), np.zeros(P, np.float32)
bias = np.full(P, -1e6)
bias[a] = 0.0
if mode == "split":
    base, text = sys.argv[6], open(sys.argv[7], "rb").read()
    prefix, W, ctx = int(meta["prefix"]), int(meta["window"]), int(meta["context"])
    Pm, m = rt.load_model(base)
    toks = np.frombuffer(text, np.uint8).astype(np.int64)
    hid, _ = rt.run_corpus(Pm, m, toks, np.array([0, len(toks)]), layers=(int(meta["layer"]),),
                           logprob=False)
    h = hid[int(meta["layer"])]
    plen = int(sys.argv[8])
    # the boundaries where the sample routes: the first at the prompt's end (it picks the
    # path the text starts with: it must stay A), then every W tokens
    bnd = [b for b in range(prefix + W, len(toks), W) if b >= plen]
    z = np.array([np.concatenate([h[max(0, b - ctx):b].mean(0), h[:b].mean(0)]) for b in bnd])
    gap, j, theta = widest_gap(z)
    b = (a + 1) % P
    t["weight"][b, j] = 1.0
    bias[b] = -theta
    print("window router: feature %d, boundaries %d, gap %.4g around %.4g: path %d above, %d below"
          % (j, len(bnd), gap, theta, b, a))
t["bias"] = bias.astype(np.float32)
g2.st_write(out, t, {k: v for k, v in meta.items() if not k.startswith("crc32")})
EOF2
"$BIN/dpc-route" sample --run R -m base.safetensors --router LR.st -n 1 - \
	<prompt.txt >s0.txt 2>s0.err || die "sample: $(cat s0.err)"
a=$(sed -n 's/.*path@position: \([0-9]*\)@.*/\1/p' s0.err)
[ -n "$a" ] || die "sample printed no path: $(cat s0.err)"
"$PY" mkwin.py "$ROOT/test/ref" const W16.st WA.st "$a" || die "mkwin.py const failed"
smp WA.st -s 1 >ta.txt 2>ta.err || die "sample: $(cat ta.err)"
grep -q '(0 switches)$' ta.err || die "sample with a constant window router switched: $(tail -n 1 ta.err)"
cat prompt.txt ta.txt >ta.all
"$PY" mkwin.py "$ROOT/test/ref" split W16.st WS.st "$a" base.safetensors ta.all \
	"$(wc -c <prompt.txt)" ||
	die "mkwin.py split failed"
seed=1
smp WS.st -s $seed >kv.txt 2>kv.err || die "sample: $(cat kv.err)"
grep -q '(0 switches)$' kv.err && die "sample: the router made to switch did not: $(tail -n 1 kv.err)"
smp WS.st -s $seed --no-cache >nc.txt 2>nc.err || die "sample --no-cache: $(cat nc.err)"
same_file kv.txt nc.txt
tail -n 1 kv.err | sed 's/^/    /'
python3 - "$(tail -n 1 kv.err)" <<'PY' || die "sample: switches off the boundaries"
import re, sys
m = re.search(r"path@position: (.*) \((\d+) switches\)$", sys.argv[1])
pos = [int(x.split("@")[1]) for x in m.group(1).split()]
ok = pos[0] == 24 and all(p >= 24 and (p - 8) % 16 == 0 for p in pos[1:])
sys.exit(0 if ok and len(pos) - 1 == int(m.group(2)) else 1)
PY
# the text as one document, byte for byte (a directory of text files keeps the bytes; the
# sample need not be UTF-8)
mkdir -p text
cat prompt.txt kv.txt >text/sample.txt
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 text tx
expect_ok "$BIN/dpc-route" eval -q --run R -m base.safetensors --router LR.st \
	--window-router WS.st --json TE.json tx/train.tok
want=$(python3 -c 'import json; print(json.load(open("TE.json"))["modes"][1]["switches"])')
got=$(tail -n 1 kv.err | sed 's/.*(\([0-9]*\) switches)$/\1/')
[ "$got" = "$want" ] || die "sample switched $got times, eval of the same text $want"
echo "sample from the run (seed $seed): cached = full forward; $got switches, as eval routes the text"

# The same with the transformer window router (fit --transformer), made to switch the same
# way: on T_A, the router's final hidden state (after ln_f) at position b - 1 of every
# boundary b, the last seq_len tokens before b as eval reads them (the reference's forward);
# a feature j and the widest gap above its first value; then the head is rewritten so that
# path A scores 1 (a spare feature k made constant 1 by ln_f) and path B x_j + 1 - theta.
route fit --scores S.st --window 16 --transformer --steps 20 -t 1 -m base.safetensors \
	-o TR.st d/router.tok
cat >mktr.py <<'EOF2'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import gpt2_torch as g2
import route_torch as rt
import torch
import torch.nn.functional as F
from gap import widest_gap
src, out, a, text, plen = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
t, meta = g2.st_read(src)
t = dict(t)
P, m = rt.load_model(src)
prefix, W, S, C = int(meta["prefix"]), int(meta["window"]), m["seq_len"], m["n_embd"]
npaths = int(meta["n_out"])
toks = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int64)
bnd = [b for b in range(prefix + W, len(toks), W) if b >= plen]
z = []
with torch.no_grad():
    for b in bnd:
        ctx = torch.from_numpy(toks[max(0, b - S):b][None, :])
        outs, _ = rt.forward(P, ctx, m)
        x = F.layer_norm(outs[-1], (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
        z.append(x[0, -1].numpy())
gap, j, theta = widest_gap(np.array(z))
k = (j + 1) % C
b = (a + 1) % npaths
t["ln_f.weight"] = t["ln_f.weight"].copy()
t["ln_f.bias"] = t["ln_f.bias"].copy()
t["ln_f.weight"][k], t["ln_f.bias"][k] = 0.0, 1.0
head = np.zeros((npaths, C), np.float32)
head[:, k] = -1.0
head[a, k] = 1.0
head[b, j], head[b, k] = 1.0, 1.0 - theta
t["lm_head.weight"] = head
g2.st_write(out, t, {kk: v for kk, v in meta.items() if not kk.startswith("crc32")})
print("transformer router: feature %d, boundaries %d, gap %.4g around %.4g: path %d above, %d below"
      % (j, len(bnd), gap, theta, b, a))
EOF2
"$PY" mktr.py "$ROOT/test/ref" TR.st TS.st "$a" ta.all "$(wc -c <prompt.txt)" ||
	die "mktr.py failed"
smp TS.st -s $seed >tk.txt 2>tk.err || die "sample: $(cat tk.err)"
grep -q '(0 switches)$' tk.err &&
	die "sample: the transformer router made to switch did not: $(tail -n 1 tk.err)"
smp TS.st -s $seed --no-cache >tn.txt 2>tn.err || die "sample --no-cache: $(cat tn.err)"
same_file tk.txt tn.txt
tail -n 1 tk.err | sed 's/^/    /'
cat prompt.txt tk.txt >text/sample.txt
rm -rf tx
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 text tx
expect_ok "$BIN/dpc-route" eval -q --run R -m base.safetensors --router LR.st \
	--window-router TS.st --json TT.json tx/train.tok
want=$(python3 -c 'import json; print(json.load(open("TT.json"))["modes"][1]["switches"])')
got=$(tail -n 1 tk.err | sed 's/.*(\([0-9]*\) switches)$/\1/')
[ "$got" = "$want" ] || die "sample switched $got times with the transformer router, eval of the same text $want"
echo "sample with the transformer router: its cache = full forwards; $got switches, as eval routes the text"

[ -z "$bug" ] || die "known bugs (every other check passed):${bug#;}"
echo "ok"
