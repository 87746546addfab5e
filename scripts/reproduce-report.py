#!/usr/bin/python3
"""reproduce-report.py - the results page of scripts/reproduce.sh, from its run directory.

    python3 scripts/reproduce-report.py --run RUNDIR --command CMD --commit ID -o PAGE.md

Reads, for every configuration RUNDIR/NAME: metrics.jsonl (dpc-outer metrics: the paths'
training and the outer steps' diagnostics), topology.json (dpc-outer topology), config.yaml
and wall; and RUNDIR/eval/*.json (dpc-route eval). Writes PAGE.md and, beside it, three PNG
plots drawn by gnuplot. Nothing on the page is typed by hand: every figure comes from those
files, and each of the paper's orderings is judged by the rule printed next to it.
Standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

CONFIGS = [
    # name, label, what it is
    ("dense-s", "dense S", "the base continued as one path (the same fork as every row)"),
    ("dense-s-seed2", "dense S, seed 2", "the same, another order of batches: the noise floor"),
    ("dense-s-seed3", "dense S, seed 3", "the same, another order of batches"),
    ("dense-s-seed4", "dense S, seed 4", "the same, another order of batches"),
    ("dense-tm", "dense S, 4x the steps", "the base continued as one path for 4x the inner "
     "steps of each phase: every token the 4-path runs' paths read, for their FLOPs (Table 1)"),
    ("dense-4s", "dense 4S", "one path, width doubled: RATIOx the parameters, from scratch for the "
     "base's steps and the forks' (another shape cannot fork from the base)"),
    ("dense-4s-halflr", "dense 4S, half the learning rate",
     "the same at half the learning rate (Adam's rate scaled as 1/width)"),
    ("diloco", "DiLoCo, 4 workers", "random shards, one module shared by all"),
    ("flat-moe", "flat MoE, 4 paths", "k-means shards, nothing shared"),
    ("dipaco-km", "DiPaCo 2x2", "k-means shards"),
    ("dipaco-km-seed2", "DiPaCo 2x2, seed 2", "the same, another order of batches: DiPaCo's noise floor"),
    ("dipaco-km-seed3", "DiPaCo 2x2, seed 3", "the same, another order of batches"),
    ("dipaco-km-seed4", "DiPaCo 2x2, seed 4", "the same, another order of batches"),
    ("dipaco-top2", "DiPaCo 2x2, top-2 shards", "each document in its 2 best k-means shards"),
    ("dipaco-disc", "DiPaCo 2x2, re-sharded", "discriminative re-sharding after half the phases, "
     "the schedule restarting there"),
    ("dipaco-paper", "DiPaCo 2x2, the paper's recipe", "k-means, top-2 shards, one discriminative "
     "re-sharding (top-2) after half the phases, the schedule restarting there"),
    ("dipaco-head", "DiPaCo 2x2 + path-specific level", "last block and head: one module per path"),
    ("dipaco-avg", "DiPaCo 2x2, plain averaging", "the outer step is the average of the paths' "
     "weights (outer lr 1, momentum 0, no rescaling): the averaging control"),
    ("dipaco-es", "DiPaCo 2x2, the paper's early stopping", "k-means shards, the last HOLDOUT of "
     "each shard held out as the path's validation set (`dipaco.holdout`); at evaluation each path "
     "at the phase of its lowest loss there (`dpc-route eval --early-stop`, the paper's section "
     "2.7)"),
    ("dipaco-moments", "DiPaCo 2x2, the base's AdamW state", "k-means shards; the paths start "
     "from the base's AdamW moments (`dpc-outer init --moments`) instead of zero ones, the bias "
     "correction counting on from the base's step"),
    ("dipaco-sampled", "DiPaCo 4x2, 4 of 8 paths a phase", "8 paths (4 + 2 modules) on k-means "
     "shards (k = 8), 4 of them trained each phase (`dipaco.paths_per_phase: 4`, the paper's "
     "section 2.6.2, drawn so that every 2 phases train all 8): the compute of DiPaCo 2x2 "
     "spread over twice the paths"),
]
DENSE_SEEDS = ("dense-s", "dense-s-seed2", "dense-s-seed3", "dense-s-seed4")
DIPACO_SEEDS = ("dipaco-km", "dipaco-km-seed2", "dipaco-km-seed3", "dipaco-km-seed4")
ROUTED = ("flat-moe", "dipaco-km", "dipaco-top2", "dipaco-disc", "dipaco-paper", "dipaco-head",
          "dipaco-avg", "dipaco-es", "dipaco-moments", "dipaco-sampled")

# one colour per configuration, the same in every plot
COLOURS = ["#1f77b4", "#7f7f7f", "#a0a0a0", "#c0c0c0", "#17306b", "#000000", "#505050", "#ff7f0e",
           "#8c564b", "#d62728", "#e377c2", "#f4a6a6", "#fbd0d0", "#2ca02c", "#9467bd",
           "#bcbd22", "#17becf", "#8c8c00", "#006d6d", "#b15928", "#6a3d9a"]
# a dash and point type per level of the outer-step plot
LEVEL_STYLE = {"all": (1, 7), "lower": (1, 7), "upper": (2, 5), "head": (3, 9)}


def die(msg):
    print("reproduce-report.py: " + msg, file=sys.stderr)
    sys.exit(1)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        die("%s: %s" % (path, e))


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die("%s: %s" % (path, e))


def config_values(path):
    """The scalar 'key: value' lines of a dpc-outer config.yaml (model and train sections)."""
    vals = {}
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"^\s+(\w+):\s*([-0-9.eE+]+|true|false)\s*$", line)
                if m and m.group(1) not in vals:
                    v = m.group(2)
                    vals[m.group(1)] = {"true": 1.0, "false": 0.0}.get(v) if v in ("true", "false") else float(v)
    except OSError as e:
        die("%s: %s" % (path, e))
    for k in ("n_layer", "n_embd", "seq_len", "batch_size", "steps", "phases", "inner_steps", "lr",
              "outer_lr", "outer_momentum", "rescale"):
        if k not in vals:
            die("%s: no %s" % (path, k))
    return vals


def read_metrics(path):
    paths, outer = [], []
    try:
        with open(path) as f:
            for line in f:
                e = json.loads(line)
                if e.get("event") == "path":
                    paths.append(e)
                elif e.get("event") == "outer":
                    outer.append(e)
    except (OSError, ValueError) as e:
        die("%s: %s" % (path, e))
    return paths, outer


def mode(ev, window):
    for m in ev["modes"]:
        if m["window"] == window:
            return m
    return None


def check_scored(evals, what):
    """Every row compared on a page must be scored on the same tokens: refuse otherwise."""
    counts = {}
    for name, ev in evals:
        for m in ev["modes"]:
            counts.setdefault(m["tokens"], []).append(
                "%s (%s)" % (name, "every %d" % m["window"] if m["window"] else "once per doc"))
    if len(counts) > 1:
        parts = ["%d tokens: %s" % (n, ", ".join(v[:3]) + (" ..." if len(v) > 3 else ""))
                 for n, v in sorted(counts.items())]
        die("the rows on %s are scored on different numbers of tokens, so they cannot be "
            "compared (%s); evaluate them all with the same dpc-route eval --score-from" % (
                what, "; ".join(parts)))


def fmt_count(x):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return "%.2f%s" % (x / div, unit)
    return "%d" % x


def gnuplot(script, where):
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True, cwd=where)
    if r.returncode != 0:
        die("gnuplot failed: " + (r.stderr.strip().splitlines() or ["?"])[0])


def stdev(xs):
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


SWEEP_RE = re.compile(r"^sweep-(dense|diloco|dipaco)-lr([0-9.]+)-mu([0-9.]+)-rs(true|false)-(peak|half|base)\.json$")
FORK_TEXT = {"peak": "re-warm to the peak", "half": "re-warm to half the peak",
             "base": "go on at the base's rate"}


def trsteps(run):
    """The training steps of the transformer window routers (their fit's report)."""
    j = load_json(os.path.join(run, "routing", "transformer64-s0-dipaco-km.json"))
    return j["report"]["steps"]


def transformer_accuracy(run):
    accs = []
    for W in (64, 128):
        for s in (0, 1):
            j = load_json(os.path.join(run, "routing", "transformer%d-s%d-dipaco-km.json" % (W, s)))
            accs.append("%.3f" % j["report"]["boundary_accuracy"])
    return ", ".join(accs[:2]) + " (every 64) and " + ", ".join(accs[2:]) + " (every 128)"


def read_sweep(run):
    """The sweep's short runs: [(method, outer lr, momentum, rescale, fork rate, loss, tokens)]."""
    rows = []
    for fn in sorted(os.listdir(os.path.join(run, "eval"))):
        m = SWEEP_RE.match(fn)
        if m:
            ev = load_json(os.path.join(run, "eval", fn))
            d = mode(ev, 0)
            rows.append((m.group(1), float(m.group(2)), float(m.group(3)), m.group(4) == "true",
                         m.group(5), d["loss"], d["tokens"]))
    return rows


def main():
    ap = argparse.ArgumentParser(description="the results page of scripts/reproduce.sh")
    ap.add_argument("--run", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    run = a.run
    settings = dict(s.split("=", 1) for s in read_text(os.path.join(run, "settings")).split())
    T = int(settings["phases"])
    tau = int(settings["inner_steps"])
    base_wall = read_text(os.path.join(run, "base", "wall")).split()
    runs = {}
    for name, label, what in CONFIGS:
        d = os.path.join(run, name)
        cv = config_values(os.path.join(d, "config.yaml"))
        topo = load_json(os.path.join(d, "topology.json"))
        pev, oev = read_metrics(os.path.join(d, "metrics.jsonl"))
        wall = read_text(os.path.join(d, "wall")).split()
        rT = int(cv["phases"])
        P = topo["paths"]
        # with path sampling only paths_per_phase of the P paths train in a phase
        trained = int(cv.get("paths_per_phase", P)) or P
        tokens_per_path = cv["steps"] * cv["batch_size"] * cv["seq_len"]
        # per token, forward and backward: 6 N, and 12 L C T for attention (PaLM's count)
        per_token = 6 * topo["params_per_path"] + 12 * cv["n_layer"] * cv["n_embd"] * cv["seq_len"]
        runs[name] = dict(
            label=label, what=what, cv=cv, topo=topo, paths=pev, outer=oev, T=rT, P=P,
            tokens=trained * tokens_per_path, flops=trained * tokens_per_path * per_token,
            per_token=per_token, wall=int(wall[0]), resumed=wall[3] == "yes",
            workers="%s x %s" % (wall[1], wall[2]),
            forked=not name.startswith("dense-4s"))
    # The base: dense S's first B phases, in every forked row's FLOPs and tokens.
    s_run = runs["dense-s"]
    bsteps = int(runs["dense-4s"]["cv"]["steps"] - s_run["cv"]["steps"])
    if bsteps <= 0 or bsteps % tau:
        die("%s: dense 4S trains %d steps and dense S %d: the base's share must be whole phases"
            % (run, runs["dense-4s"]["cv"]["steps"], s_run["cv"]["steps"]))
    B = bsteps // tau
    CURVE = list(range(T // 4, T + 1, T // 4))  # the forks' phases with a curve point
    curve_text = ", ".join(str(t) for t in CURVE[:-1]) + " and %d" % CURVE[-1]
    base_tokens = bsteps * s_run["cv"]["batch_size"] * s_run["cv"]["seq_len"]
    base_flops = base_tokens * s_run["per_token"]
    for name, r in runs.items():
        if r["forked"]:
            r["tokens"] += base_tokens
            r["flops"] += base_flops
        # after every T/4-th phase of the forks: (phase of the whole lineage, steps of one
        # path, loss, FLOPs so far); the file is named by the run's own phase
        own = 0 if r["forked"] else B
        r["curve_files"] = ["%s-curve-%d.json" % (name, t + own) for t in CURVE]
        r["curve"] = [(B + t, bsteps + t * int(r["cv"]["inner_steps"]), mode(load_json(os.path.join(run, "eval", fn)), 0)["loss"],
                       base_flops + (r["flops"] - base_flops) * t / r["T"] if r["forked"]
                       else r["flops"] * (B + t) / r["T"]) for t, fn in zip(CURVE, r["curve_files"])]
        r["final"] = load_json(os.path.join(run, "eval", name + "-final.json"))
        r["unseen"] = load_json(os.path.join(run, "eval", name + "-unseen.json"))
        r["doc"], r["win"] = mode(r["final"], 0), mode(r["final"], 64)
    kmdisc = load_json(os.path.join(run, "eval", "dipaco-km-disc-final.json"))
    es_last = load_json(os.path.join(run, "eval", "dipaco-es-last.json"))
    base_final = load_json(os.path.join(run, "eval", "base-final.json"))
    base_unseen = load_json(os.path.join(run, "eval", "base-unseen.json"))
    reroute = {s: load_json(os.path.join(run, "eval", "dipaco-km-reroute-%s.json" % s))
               for s in ("final", "unseen")}
    sweep = read_sweep(run)
    check_scored([(n + "-final", r["final"]) for n, r in runs.items()] +
                 [("dipaco-km-disc-final", kmdisc), ("dipaco-es-last", es_last),
                  ("base-final", base_final), ("dipaco-km-reroute-final", reroute["final"])],
                 "the validation split")
    check_scored([(fn[:-5], load_json(os.path.join(run, "eval", fn)))
                  for r in runs.values() for fn in r["curve_files"]], "the quarter split")
    check_scored([(n + "-unseen", r["unseen"]) for n, r in runs.items()] +
                 [("base-unseen", base_unseen), ("dipaco-km-reroute-unseen", reroute["unseen"])],
                 "the unseen text")
    if sweep and len(set(x[6] for x in sweep)) > 1:
        die("the sweep's runs are scored on different numbers of tokens, so they cannot be compared")

    L = {n: r["doc"]["loss"] for n, r in runs.items()}
    U = {n: mode(r["unseen"], 0)["loss"] for n, r in runs.items()}
    Lb, Ub = mode(base_final, 0)["loss"], mode(base_unseen, 0)["loss"]
    dense_seeds = [L[n] for n in DENSE_SEEDS]
    dipaco_seeds = [L[n] for n in DIPACO_SEEDS]
    # the noise floors: twice the standard deviation of a difference. One run's spread is the
    # larger of dense S's and DiPaCo's over their 4 seeds; the difference of two single runs
    # has sqrt(2) times it, a single run against a mean of 4 sqrt(1 + 1/4) times it, and two
    # means of 4 have the standard error of their difference
    sd_s, sd_d = stdev(dense_seeds), stdev(dipaco_seeds)
    noise_s, noise_d = 2 * sd_s, 2 * sd_d
    sd1 = max(sd_s, sd_d)
    noise = 2 * sd1 * 2 ** 0.5
    noise_one_mean = 2 * sd1 * 1.25 ** 0.5
    mean_s, mean_d = sum(dense_seeds) / 4, sum(dipaco_seeds) / 4
    noise_mean = 2 * (sd_s ** 2 / 4 + sd_d ** 2 / 4) ** 0.5
    page = []
    out = page.append
    quick = settings.get("quick") == "1"
    cv = s_run["cv"]
    out("# DiPaCo on Brown: the paper's protocol and orderings at small scale")
    out("")
    out("Generated by `%s` at commit %s; do not edit by hand." % (a.command, a.commit))
    if quick:
        out("")
        out("**A --quick run**: a model of width %d, %d phases of %d steps. It checks the script, "
            "not the claims." % (cv["n_embd"], T, tau))
    out("")
    out("As the paper runs it (arXiv 2403.10616, Algorithm 1 and section 4): a base model, dense S "
        "(%s parameters), is trained on all the training data for %d steps of a %d-step schedule "
        "(the paper forks from a model pretrained for 24k of 88k steps); every row but dense 4S "
        "forks from it (`dpc-outer init --from`) and trains %d phases of %d steps per path, each "
        "step a batch of %d sequences of %d bytes; the routers' features come from the base. Dense "
        "4S, of another shape, trains from scratch for all %d steps. The outer optimizer and the "
        "fork's learning rate were chosen by the same sweep for DiLoCo and DiPaCo, and the fork's "
        "rate for dense S too (below). Data: the Brown corpus (500 documents, 15 genres), as "
        "bytes, documents cut into 1024-byte pieces; validation %d pieces, held out from training, "
        "tuning and the routers." % (
            fmt_count(s_run["topo"]["params_per_path"]), bsteps, bsteps + T * tau, T, tau,
            cv["batch_size"], cv["seq_len"], bsteps + T * tau, s_run["final"]["docs"]))
    out("Every row is scored on the same %d bytes: from byte %d of each piece on (the routers see "
        "the first %d; `dpc-route eval --score-from`, and the page refuses rows of other counts). "
        "Losses are nats per byte; perplexity is per byte." % (
            s_run["doc"]["tokens"], s_run["final"]["score_from"], s_run["final"]["score_from"]))
    out("")
    big = min(("dense-4s", "dense-4s-halflr"), key=lambda n: L[n])
    gap = mean_s - L[big]
    capacity = gap > noise_one_mean
    verdicts = {}

    def claim(key, text, measured, margin, floor=None, testable=True):
        floor = noise if floor is None else floor
        if not testable:
            v = "not testable here"
        elif margin > floor:
            v = "held"
        elif margin > 0:
            v = "held, within noise"
        elif -margin <= floor:
            v = "not held, within noise"
        else:
            v = "not held"
        verdicts[key] = v
        out("| %s | %s | %.4f | %+.4f | %s |" % (text, measured, floor, margin, v))

    def lv(n):
        return "%.4f" % L[n]

    def budget(n, mean=None):
        """A row's loss (or, given, the mean of its 4 seeds) with its budget."""
        r = runs[n]
        return "%s %.4f (%s; %s tokens, %.2e FLOPs, %s parameters)" % (
            r["label"], L[n] if mean is None else mean,
            "one run" if mean is None else "mean of 4 seeds",
            fmt_count(r["tokens"]), r["flops"], fmt_count(r["topo"]["params_total"]))

    out("## Table 1: at equal tokens and FLOPs")
    out("")
    out("The paper's central comparison (its Table 1, section 4.3) holds the budget fixed: at the "
        "same tokens and FLOPs, DiLoCo on one path-sized model (13.8 perplexity) is worse than "
        "every modular DiPaCo (12.4 at 16x16), and flat MoE sits near DiPaCo when shards are "
        "large. Here the three, and dense S run for 4x the steps (one model, trained in order on "
        "every token the paths read), read the same tokens for the same FLOPs (each row says "
        "so); DiPaCo holds %.1fx DiLoCo's parameters and flat MoE %.1fx. Each claim is judged "
        "as the orderings below are, against twice the standard deviation of its own difference "
        "(the floor column; see the noise floors there)." % (
            runs["dipaco-km"]["topo"]["params_total"] / runs["diloco"]["topo"]["params_total"],
            runs["flat-moe"]["topo"]["params_total"] / runs["diloco"]["topo"]["params_total"]))
    out("")
    for n in ("flat-moe", "dipaco-km", "dense-tm"):
        if (runs[n]["tokens"], runs[n]["flops"]) != (runs["diloco"]["tokens"], runs["diloco"]["flops"]):
            die("%s: %s reads %d tokens for %.3e FLOPs and DiLoCo %d for %.3e: Table 1 needs "
                "equal budgets" % (run, n, runs[n]["tokens"], runs[n]["flops"],
                                   runs["diloco"]["tokens"], runs["diloco"]["flops"]))
    out("| claim | measured | floor | margin | verdict |")
    out("|---|---|--:|--:|---|")
    claim("t1-diloco", "DiPaCo 2x2 below DiLoCo", "%s; %s" % (
        budget("dipaco-km", mean_d), budget("diloco")), L["diloco"] - mean_d, floor=noise_one_mean)
    claim("t1-flat", "DiPaCo 2x2 below flat MoE", "%s; %s" % (
        budget("dipaco-km", mean_d), budget("flat-moe")), L["flat-moe"] - mean_d,
        floor=noise_one_mean)
    claim("t1-flat-diloco", "flat MoE below DiLoCo", "%s; %s" % (
        budget("flat-moe"), budget("diloco")), L["diloco"] - L["flat-moe"])
    claim("t1-dense", "DiPaCo 2x2 below dense S at equal tokens and FLOPs", "%s; %s" % (
        budget("dipaco-km", mean_d), budget("dense-tm")), L["dense-tm"] - mean_d,
        floor=noise_one_mean)
    out("")
    out("## Results")
    out("")
    out("| configuration | params per path | total params | training FLOPs | tokens seen "
        "| wall s (workers x threads) | val loss, once per doc | ppl | val loss, re-routed every 64 "
        "| ppl | unseen text |")
    out("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")

    def row(label, r, doc, win, unseen):
        wl = "%.4f" % win["loss"] if win else "-"
        wp = "%.3f" % win["perplexity"] if win else "-"
        out("| %s | %s | %s | %s | %s | %d%s (%s) | %.4f | %.3f | %s | %s | %s |" % (
            label, fmt_count(r["topo"]["params_per_path"]), fmt_count(r["topo"]["params_total"]),
            "%.2e" % r["flops"], fmt_count(r["tokens"]), r["wall"], "*" if r["resumed"] else "",
            r["workers"], doc["loss"], doc["perplexity"], wl, wp,
            "%.4f" % unseen if unseen is not None else "-"))

    b = dict(topo=s_run["topo"], flops=base_flops, tokens=base_tokens, wall=int(base_wall[0]),
             resumed=False, workers="%s x %s" % (base_wall[1], base_wall[2]))
    row("the base (dense S, step %d)" % bsteps, b, mode(base_final, 0), None, Ub)
    for name, label, what in CONFIGS:
        r = runs[name]
        row(label, r, r["doc"], r["win"], U[name])
    r = runs["dipaco-km"]
    row("DiPaCo 2x2, discriminative router at evaluation", r, mode(kmdisc, 0), mode(kmdisc, 64), None)
    row("DiPaCo 2x2, validation sets held out, every path at the last phase", runs["dipaco-es"],
        mode(es_last, 0), mode(es_last, 64), None)
    out("")
    out("What each is:")
    out("")
    out("- **the base**: dense S after %d steps; the fork of every other row but dense 4S, and "
        "the routers' base model." % bsteps)
    for name, label, what in CONFIGS:
        c = runs[name]["cv"]
        extra = ""
        if runs[name]["P"] > 1:
            extra = ", outer lr %g, momentum %g, rescaling %s" % (
                c["outer_lr"], c["outer_momentum"], "on" if c["rescale"] else "off")
        ratio = "%.1f" % (runs["dense-4s"]["topo"]["params_per_path"] / s_run["topo"]["params_per_path"])
        what = what.replace("RATIO", ratio).replace(
            "HOLDOUT", "%g%%" % (100 * c.get("holdout_frac", 0.05)))
        out("- **%s**: %s (learning rate %g%s)." % (label, what, c["lr"], extra))
    out("- **DiPaCo 2x2, discriminative router at evaluation**: the k-means run's paths, routed "
        "by a discriminative router fitted on their scores of the router split.")
    out("- **DiPaCo 2x2, validation sets held out, every path at the last phase**: the "
        "early-stopping run's paths without early stopping: what the choice of phases alone "
        "changed.")
    out("")
    out("Training FLOPs: 6 N + 12 L C T per token (N parameters of a path, L blocks, width C, "
        "context T), times the tokens seen by all paths, the base's included for the rows forked "
        "from it. Unseen text: the licence texts of /usr/share/common-licenses, which no stage "
        "trained, tuned or routed on, scored the same way. Re-routing needs a window router, so "
        "the one-model runs (dense, DiLoCo) have none. Wall time: the training stage's%s; "
        "evaluation not included." % (
            " (* marks a stage that was resumed after an interruption)"
            if any(r["resumed"] for r in runs.values()) else ""))
    out("")

    # Re-routing: the linear window router against the paper's transformer.
    RR = ["once per document", "every 64, linear", "every 64, transformer (seed 0)",
          "every 64, transformer (seed 1)", "every 128, linear",
          "every 128, transformer (seed 0)", "every 128, transformer (seed 1)"]
    rf, ru = reroute["final"]["modes"], reroute["unseen"]["modes"]
    if len(rf) != len(RR) or len(ru) != len(RR):
        die("%s/eval/dipaco-km-reroute-*.json: %d and %d modes, expected %d" % (
            run, len(rf), len(ru), len(RR)))
    out("## Re-routing: the linear window router and the paper's transformer")
    out("")
    out("The k-means DiPaCo 2x2's final paths, each piece routed first by the k-means router, then "
        "again every W bytes by a window router fitted on the router split's scores: the linear "
        "one (a logistic regression on two means of the base's last block) or the paper's "
        "(its section 7.2.2: the base fine-tuned with a head over the 4 paths, predicting at "
        "every position the best path for the next W bytes; `dpc-route fit --transformer`, %d "
        "steps, two seeds)." % trsteps(run))
    out("")
    out("| routing | val loss | ppl | switches per piece | cost (wall, vs once per doc) "
        "| unseen text |")
    out("|---|--:|--:|--:|--:|--:|")
    for label, m, u in zip(RR, rf, ru):
        out("| %s | %.4f | %.3f | %.2f | %.2fx | %.4f |" % (
            label, m["loss"], m["perplexity"], m["switches_per_doc"], m["cost_vs_document"],
            u["loss"]))
    tr_spread = {64: abs(rf[2]["loss"] - rf[3]["loss"]), 128: abs(rf[5]["loss"] - rf[6]["loss"])}
    out("")
    out("The transformer's two fits differ by %.4f (every 64) and %.4f (every 128) nats: the "
        "noise floor of its fit; DiPaCo's across 4 seeds is %.4f." % (
            tr_spread[64], tr_spread[128], noise_d))
    out("")

    # The sweep.
    carried = {}
    if sweep:
        out("## The sweep: the outer optimizer and the fork's learning rate")
        out("")
        out("On a short budget (%s of %d steps, forked from the base), scored on a quarter "
            "of the validation split. The outer optimizer was swept for DiLoCo and DiPaCo 2x2 "
            "alike with the fork re-warming to the peak; then the fork's learning rate at each "
            "one's best, and for dense S. The best of each (**bold**) is what the full runs use." % (
                "1 phase" if T // 4 == 1 else "%d phases" % (T // 4), tau))
        out("")
        src = os.path.join(run, "sweep", "from")
        if os.path.exists(src):
            with open(src) as f:
                line = f.readline().strip()
            out("This sweep was not run with the rows below: its scores were taken from an "
                "earlier run of the same settings (`reproduce.sh --sweep-from`): %s. Its runs "
                "forked from that run's base, which may differ in its last bits from this one's "
                "where the CPU differs; the settings it chose are what carried over." % line)
            out("")
        for meth in ("diloco", "dipaco", "dense"):
            rows = sorted([x for x in sweep if x[0] == meth], key=lambda x: x[5])
            if not rows:
                continue
            carried[meth] = rows[0]
            out("%s:" % {"diloco": "DiLoCo", "dipaco": "DiPaCo 2x2", "dense": "dense S"}[meth])
            out("")
            out("| outer lr | momentum | rescaling | the fork's rate | loss | against the best |")
            out("|--:|--:|---|---|--:|--:|")
            for k, x in enumerate(rows):
                tag = "**" if k == 0 else ""
                ctl = " (plain averaging)" if (x[1], x[2], x[3]) == (1.0, 0.0, False) and meth != "dense" else ""
                out("| %s%g%s | %g | %s | %s | %s%.4f%s | %+.4f |" % (
                    tag, x[1], tag, x[2], "on" if x[3] else "off", FORK_TEXT[x[4]] + ctl, tag,
                    x[5], tag, x[5] - rows[0][5]))
            out("")
        d = [x for x in sweep if x[0] == "dipaco"]
        dl = [x for x in d if (x[1], x[2], x[3], x[4]) == (0.7, 0.9, True, "peak")]
        av = [x for x in d if (x[1], x[2], x[3], x[4]) == (1.0, 0.0, False, "peak")]
        if dl and av and "dipaco" in carried:
            out("What it says about the overshoot: DiLoCo's defaults (outer lr 0.7, Nesterov "
                "momentum 0.9, sqrt(P) rescaling), tuned for 500 inner steps, reach %.4f on "
                "DiPaCo 2x2 here; plain averaging %.4f; the best, outer lr %g, momentum %g, "
                "rescaling %s, %.4f. A first Nesterov step with rescaling moves a shared module by "
                "0.7 x 1.9 x 1.41 = 1.88 times its paths' mean delta." % (
                    dl[0][5], av[0][5], carried["dipaco"][1], carried["dipaco"][2],
                    "on" if carried["dipaco"][3] else "off", carried["dipaco"][5]))
            out("")

    # The orderings.
    out("## The paper's orderings")
    out("")
    out("Noise floors: dense S over 4 seeds ends at %s nats, DiPaCo 2x2 at %s; twice their "
        "standard deviations are %.4f and %.4f. A seed changes the order of batches only: the "
        "base, the shards and the routers are the same in every seed, so the floors are those of "
        "training, not of routing. Each claim is judged against twice the standard deviation of "
        "its own difference, one run's spread being the larger of the two: **%.4f** between two "
        "single runs (sqrt(2) times it), **%.4f** between one run and a mean of 4, **%.4f** "
        "between the two means of 4 (their standard error); the floor column says which. A "
        "margin (in the paper's direction, positive when it holds) larger than the floor is "
        "**held**; a positive one within it is **held, within noise**; a negative one is **not "
        "held** (**within noise** when it is smaller than the floor). Four seeds make a rough "
        "floor: read small margins as ties." % (
            ", ".join("%.4f" % x for x in dense_seeds), ", ".join("%.4f" % x for x in dipaco_seeds),
            noise_s, noise_d, noise, noise_one_mean, noise_mean))
    out("")
    out("**The precondition**: the better dense 4S (%s) ends at %.4f against dense S's mean %.4f: "
        "%s. %s" % (
            runs[big]["label"], L[big], mean_s,
            "capacity counts here, by %.4f nats" % gap if capacity else
            "dense 4S does not beat dense S beyond the floor (%+.4f)" % gap,
            "The capacity claims are testable." if capacity else
            "Claims that DiPaCo's extra capacity helps are **not testable here**."))
    out("")
    out("| claim | measured | floor | margin | verdict |")
    out("|---|---|--:|--:|---|")
    xs = runs["dipaco-km"]["tokens"] / s_run["tokens"]
    claim("below-dense", "DiPaCo 2x2 below dense S at equal steps (the paper's figure 8; means "
          "of 4 seeds)", "DiPaCo %.4f, dense S %.4f; DiPaCo reads %.1fx dense S's tokens and "
          "FLOPs" % (mean_d, mean_s, xs), mean_s - mean_d, floor=noise_mean)
    claim("paper-below-dense", "the paper's recipe below dense S at equal steps",
          "the recipe %s, dense S %.4f (mean of 4); %.1fx the tokens" % (
              lv("dipaco-paper"), mean_s, xs), mean_s - L["dipaco-paper"], floor=noise_one_mean)
    claim("approach-4s", "DiPaCo approaching dense 4S (closing half the gap or more)",
          "the better dense 4S (%s) %s; DiPaCo closes %s of dense S's gap to it" % (
              runs[big]["label"], lv(big),
              "%.0f%%" % (100 * (mean_s - mean_d) / gap) if gap > 0 else "none (no gap)"),
          (mean_s - mean_d) - 0.5 * gap, floor=noise_mean, testable=capacity)
    claim("unseen", "DiPaCo below its base on unseen text",
          "DiPaCo %.4f, the base %.4f (dense S %.4f)" % (U["dipaco-km"], Ub, U["dense-s"]),
          Ub - U["dipaco-km"])
    claim("top2", "top-2 overlapping shards helping",
          "top-2 %s, top-1 %s" % (lv("dipaco-top2"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-top2"])
    claim("disc", "discriminative re-sharding beating k-means",
          "re-sharded %s, k-means %s" % (lv("dipaco-disc"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-disc"])
    kd = mode(kmdisc, 0)["loss"]
    claim("disc-route", "discriminative routing beating k-means (same paths, routing only)",
          "discriminative %.4f, k-means %s" % (kd, lv("dipaco-km")), L["dipaco-km"] - kd)
    w = runs["dipaco-km"]["win"]["loss"]
    others = ["%s %+.4f" % (runs[n]["label"], runs[n]["doc"]["loss"] - runs[n]["win"]["loss"])
              for n in ROUTED if n != "dipaco-km"]
    claim("reroute", "re-routing every 64 tokens beating once per document",
          "DiPaCo 2x2: %.4f vs %s (the others, once per doc minus re-routed: %s)" % (
              w, lv("dipaco-km"), "; ".join(others)), L["dipaco-km"] - w)
    tr64 = (rf[2]["loss"] + rf[3]["loss"]) / 2
    claim("transformer-reroute", "the paper's transformer window router re-routing better than "
          "the linear one (every 64; the mean of its 2 fits)",
          "transformer %.4f, linear %.4f (once per doc %.4f)" % (tr64, rf[1]["loss"], rf[0]["loss"]),
          rf[1]["loss"] - tr64, floor=tr_spread[64])
    claim("sampled", "8 paths at 4 a phase beating DiPaCo 2x2 at the same compute",
          "4 of 8 %s, 2x2 %s" % (lv("dipaco-sampled"), lv("dipaco-km")),
          L["dipaco-km"] - L["dipaco-sampled"], testable=capacity)
    claim("head", "a path-specific level helping",
          "with %s, without %s" % (lv("dipaco-head"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-head"],
          testable=capacity)
    claim("diloco", "DiLoCo below dense S at equal steps",
          "DiLoCo %s, dense S %.4f (mean of 4); DiLoCo reads %.1fx the tokens" % (
              lv("diloco"), mean_s, runs["diloco"]["tokens"] / s_run["tokens"]),
          mean_s - L["diloco"], floor=noise_one_mean)
    claim("avg", "the tuned outer step beating plain averaging (DiPaCo 2x2)",
          "tuned %s, averaging %s" % (lv("dipaco-km"), lv("dipaco-avg")), L["dipaco-avg"] - L["dipaco-km"])
    es_src = runs["dipaco-es"]["final"].get("source", "")
    es_at = re.search(r"at phases ([0-9,]+)", es_src)
    Les = mode(es_last, 0)["loss"]
    claim("early-stop", "the paper's early stopping helping (DiPaCo 2x2, the same paths)",
          "early-stopped %s (paths at phases %s), the same paths at the last phase %.4f" % (
              lv("dipaco-es"), es_at.group(1) if es_at else "?", Les), Les - L["dipaco-es"])
    claim("holdout", "held-out validation sets and early stopping together beating DiPaCo 2x2 "
          "without them (section 2.7)",
          "early-stopped %s (at the last phase %.4f); DiPaCo 2x2 without %.4f (mean of 4 seeds)" % (
              lv("dipaco-es"), Les, mean_d), mean_d - L["dipaco-es"], floor=noise_one_mean)
    claim("moments", "starting the paths from the base's AdamW state helping (DiPaCo 2x2)",
          "with the base's moments %s, fresh ones %.4f (mean of 4 seeds)" % (
              lv("dipaco-moments"), mean_d), mean_d - L["dipaco-moments"], floor=noise_one_mean)
    out("")
    out("Every margin is the second loss minus the first, in the claim's direction: a tie is "
        "within noise either way, never held. Claims about capacity (approaching dense 4S, more "
        "paths at the same compute, a path-specific level) are judged only when the "
        "precondition holds.")
    out("")

    # Why, where a claim does not hold.
    read = T * tau * cv["batch_size"] * cv["seq_len"]  # tokens one path reads in the forks

    def shard_tokens(name):
        sh = load_json(os.path.join(run, name, "shards", "shards.json"))["shards"]
        return sum(x["tokens"] for x in sh) / len(sh)

    def val_spread(name, t):
        v = [e["val_loss"] for e in runs[name]["paths"] if e["phase"] == t and e.get("val_loss") is not None]
        return max(v) - min(v) if v else float("nan")

    def split_report(path):
        """NMI against Brown's categories and the documents per shard, from dpc-shard's report."""
        try:
            txt = open(path).read()
        except OSError:
            return None, []
        m = re.search(r"NMI ([0-9.]+)", txt)
        docs = [int(x) for x in re.findall(r"^  \d+ +(\d+) +\d+$", txt, re.M)]
        return (float(m.group(1)) if m else None), docs

    hp = "routing-phase-%04d.txt" % (T // 2)

    def shard_compare():
        (kn, kd_), (dn, dd) = (split_report(os.path.join(run, "dipaco-km", "routing.txt")),
                               split_report(os.path.join(run, "dipaco-disc", hp)))
        if kn is None or dn is None or not kd_ or not dd:
            return ""
        return ("Its shards agree %s with Brown's categories than the k-means ones (NMI %.4f "
                "against %.4f) and hold %d to %d documents (k-means: %d to %d)." % (
                    "less" if dn < kn else "as much or more", dn, kn, min(dd), max(dd),
                    min(kd_), max(kd_)))

    km_sh, top2_sh = shard_tokens("dipaco-km"), shard_tokens("dipaco-top2")
    km_nmi = split_report(os.path.join(run, "dipaco-km", "routing.txt"))[0]
    km_cv = runs["dipaco-km"]["cv"]
    first = km_cv["outer_lr"] * (1 + km_cv["outer_momentum"]) * (2 ** 0.5 if km_cv["rescale"] else 1)
    why = {
        "below-dense": "The curves show where DiPaCo loses: after phase %d it is at %.4f "
                       "against dense S's %.4f, and at the end %.4f against %.4f. Its first outer "
                       "step moves each shared module by %.2f times its paths' mean delta (outer "
                       "learning rate %g, momentum %g, rescaling %s), and each path sees a quarter "
                       "of the data for as many steps as dense S sees all of it; the sweep above "
                       "shows how each outer setting fared on the short budget." % (
                           CURVE[0], runs["dipaco-km"]["curve"][0][2], s_run["curve"][0][2], L["dipaco-km"],
                           mean_s, first, km_cv["outer_lr"], km_cv["outer_momentum"],
                           "on" if km_cv["rescale"] else "off"),
        "approach-4s": "Dense 4S uses its %.1fx parameters on every batch; DiPaCo's 2x capacity "
                       "is split by topic and each path reads a quarter of the shards." % (
                           runs["dense-4s"]["topo"]["params_per_path"] / s_run["topo"]["params_per_path"]),
        "t1-diloco": "DiLoCo trains every parameter of its one model on all %s tokens the "
                     "paths read; DiPaCo 2x2 trains each module on the tokens of 2 of its 4 "
                     "paths, so its %.1fx parameters each see half as much (and flat MoE's a "
                     "quarter). That pays only where capacity binds (%s) and the shards differ "
                     "enough to route (the k-means shards' NMI with Brown's categories: %s)." % (
                         fmt_count(runs["diloco"]["tokens"] - base_tokens),
                         runs["dipaco-km"]["topo"]["params_total"] / runs["diloco"]["topo"]["params_total"],
                         "dense 4S ends %.4f below dense S" % gap if capacity else
                         "here it does not: dense 4S ends %+.4f from dense S" % -gap,
                         "%.4f" % km_nmi if km_nmi is not None else "not reported"),
        "t1-dense": "Dense S at 4x the steps trains all %s parameters on every token, in "
                    "order, with nothing averaged: what DiLoCo and DiPaCo approximate with 4 "
                    "workers. DiPaCo ends %+.4f from it and DiLoCo %+.4f." % (
                        fmt_count(runs["dense-tm"]["topo"]["params_total"]),
                        mean_d - L["dense-tm"], L["diloco"] - L["dense-tm"]),
        "t1-flat": "The paper's gap comes from flat experts overfitting small shards as paths "
                   "multiply (256 there). Here a k-means shard holds %s tokens on average and "
                   "a path reads %s of them: %.2f epochs, too few to overfit, so sharing has "
                   "little to prevent." % (fmt_count(km_sh), fmt_count(read), read / km_sh),
        "t1-flat-diloco": "Flat MoE trains each of its 4 models on one shard's tokens, %.2f "
                          "epochs of it; DiLoCo's one model reads all the paths' tokens, 4x what "
                          "any flat expert sees, for a quarter of the parameters." % (read / km_sh),
        "top2": "Overlap helps when shards are small enough to be repeated: a top-2 shard holds "
                "%s tokens on average (top-1: %s) and a path reads %s, %.2f epochs of a top-1 "
                "shard, so no path runs out of fresh data; overlap only makes paths less "
                "specialised." % (fmt_count(top2_sh), fmt_count(km_sh), fmt_count(read), read / km_sh),
        "disc": "The discriminative router learns each document's best path from the re-sharded "
                "run's paths after phase %d, whose validation losses then spanned %.4f nats. %s" % (
                    T // 2, val_spread("dipaco-disc", T // 2), shard_compare()),
        "disc-route": "After the last phase the k-means run's paths' validation losses span %.4f "
                      "nats; the best path of a document differs from the others by less than its "
                      "first 128 bytes can predict." % val_spread("dipaco-km", T),
        "reroute": "The window router switched paths %.2f times per 1024-byte piece; a piece of "
                   "Brown is one text of one genre, and each switch restarts the context on the "
                   "new path." % runs["dipaco-km"]["win"]["switches_per_doc"],
        "sampled": "Each of the 8 paths trains every other phase, so it sees half the steps of a "
                   "2x2 path on a shard half the size, and each module is updated by fewer paths "
                   "per phase.",
        "transformer-reroute": "The transformer router's in-sample accuracy at the router split's "
                               "boundaries was %s (its fit's report); a piece of Brown is one text "
                               "of one genre, so the best path rarely changes within it." % (
                                   transformer_accuracy(run)),
        "head": "The path-specific level gives each path %s parameters of its own, trained by one "
                "path's steps instead of two." % fmt_count(
                    [m for m in runs["dipaco-head"]["topo"]["module_list"]
                     if m["level"] == "head"][0]["params"]),
        "diloco": "DiLoCo's outer step averages the 4 workers' deltas; the sweep above shows the "
                  "outer settings tried on the short budget.",
        "unseen": "On text unlike Brown, each path has specialised to a quarter of Brown since the "
                  "fork (%.4f against the base's %.4f), and the router picks from features the "
                  "base computes on text it never saw." % (U["dipaco-km"], Ub),
        "avg": "On this budget the averaging control does at least as well as the tuned outer "
               "step: the sweep chose on %d of the full runs' %d phases." % (T // 4, T),
        "paper-below-dense": "See below-dense: the recipe adds top-2 shards and a re-sharding to "
                             "the same outer step.",
        "early-stop": "Each path's held-out loss was lowest at the last phase for %s of the 4 "
                      "paths, so early stopping could change little: the paths were still "
                      "improving when the run ended." % (
                          (es_at.group(1).split(",").count(str(T)) if es_at else "?")),
        "holdout": "The held-out run trains each path on %g%% fewer tokens of its shard (at the "
                   "last phase %.4f against DiPaCo's mean %.4f), and early stopping moved it by "
                   "%+.4f." % (100 * runs["dipaco-es"]["cv"].get("holdout_frac", 0.05), Les,
                               mean_d, L["dipaco-es"] - Les),
        "moments": "After phase %d the run with the base's moments is at %.4f against %.4f "
                   "with fresh ones (seed 1), at the end %.4f against %.4f: the fork re-warms "
                   "the learning rate over %d steps either way, and AdamW's bias correction "
                   "makes fresh moments the size of the first gradients within a few steps." % (
                       CURVE[0], runs["dipaco-moments"]["curve"][0][2],
                       runs["dipaco-km"]["curve"][0][2], L["dipaco-moments"], L["dipaco-km"],
                       runs["dipaco-moments"]["cv"].get("warmup_steps", 0)),
    }
    failed = [k for k, v in verdicts.items() if v.startswith("not held")]
    if failed:
        out("### Where an ordering does not hold, and why we think so")
        out("")
        for k in failed:
            out("- **%s**: %s" % (k, why[k]))
        out("")
        out("What a 2-core machine cannot show: the paper's runs are 150M-parameter paths, "
            "billions of tokens, up to 256 paths; here paths have %s parameters and see %s "
            "tokens each. Orderings that depend on scale (overfitting of flat experts, paths "
            "becoming different enough to route between) need far more of both." % (
                fmt_count(runs["dipaco-km"]["topo"]["params_per_path"]),
                fmt_count(runs["dipaco-km"]["tokens"] / 4)))
        out("")

    # Plots, beside the page; its folder is made only now that every input has been read.
    base = os.path.splitext(a.output)[0]
    where = os.path.dirname(os.path.abspath(a.output))
    os.makedirs(where, exist_ok=True)
    name_steps = os.path.basename(base) + "-loss-steps.png"
    name_flops = os.path.basename(base) + "-loss-flops.png"
    name_outer = os.path.basename(base) + "-outer.png"
    with tempfile.TemporaryDirectory() as tmp:
        series = []
        for i, (name, label, _) in enumerate(CONFIGS):
            r = runs[name]
            fn = os.path.join(tmp, "curve-%s.dat" % name)
            with open(fn, "w") as f:
                for t, steps, loss, fl in r["curve"]:
                    f.write("%d %.6e %.6f\n" % (steps, fl, loss))
            series.append((fn, label, i + 1))
        common = ("set terminal pngcairo size 1000,600 noenhanced\n"
                  "set grid; set key outside right\n"
                  "set ylabel 'validation loss, once per document (nats/byte)'\n")
        plot = ", ".join("'%s' using %%s with linespoints lw 2 pt 7 lc rgb '%s' title \"%s\"" % (
            fn, COLOURS[c - 1], lab) for fn, lab, c in series)
        gnuplot(common + "set output '%s'\nset title 'validation loss (quarter split) against steps "
                "per path; dashed: the fork'\nset xlabel 'steps per path, the base included'\n"
                "set arrow from %d, graph 0 to %d, graph 1 nohead dt 2\n"
                "plot %s\n" % (name_steps, bsteps, bsteps, plot.replace("%s", "1:3")), where)
        gnuplot(common + "set output '%s'\nset title 'validation loss against training FLOPs "
                "(all paths)'\nset xlabel 'training FLOPs'\nset logscale x\nset format x '%%.0e'\n"
                "plot %s\n" % (name_flops, plot.replace("%s", "2:3")), where)
        # Outer-step diagnostics: per level, the mean delta norm and the mean pairwise cosine.
        dn, cs = [], []
        for c, (name, label, _) in enumerate(CONFIGS):
            r = runs[name]
            if r["P"] < 2:
                continue
            levels = sorted(set(e["level"] for e in r["outer"]))
            for lev in levels:
                dt, pt = LEVEL_STYLE.get(lev, (4, 11))
                style = "lw 2 dt %d pt %d lc rgb '%s'" % (dt, pt, COLOURS[c])
                fn = os.path.join(tmp, "outer-%s-%s.dat" % (name, lev))
                has_cos = False
                with open(fn, "w") as f:
                    for t in range(1, r["T"] + 1):
                        es = [e for e in r["outer"] if e["level"] == lev and e["phase"] == t]
                        norms = [x for e in es for x in e["delta_norms"]]
                        coss = [e["mean_pairwise_cosine"] for e in es
                                if e.get("mean_pairwise_cosine") is not None]
                        if not norms:
                            continue
                        has_cos = has_cos or bool(coss)
                        f.write("%d %.6f %s\n" % (t, sum(norms) / len(norms),
                                                  "%.6f" % (sum(coss) / len(coss)) if coss else "NaN"))
                t = "%s: %s" % (label, lev)
                dn.append("'%s' using 1:2 with linespoints %s title \"%s\"" % (fn, style, t))
                if has_cos:
                    cs.append("'%s' using 1:3 with linespoints %s title \"%s\"" % (fn, style, t))
        gnuplot("set terminal pngcairo size 1200,1000 noenhanced\nset output '%s'\n"
                "set multiplot layout 2,1\nset grid; set key outside right\nset xlabel 'phase'\n"
                "set xtics 1\nset title \"outer step: mean norm of the paths' deltas, per level\"\n"
                "set ylabel 'L2 norm'\nplot %s\n"
                "set title 'outer step: mean pairwise cosine of the deltas averaged in a module, per level'\n"
                "set ylabel 'cosine'\nplot %s\nunset multiplot\n" % (name_outer, ", ".join(dn),
                                                                       ", ".join(cs)), where)

    out("## Plots")
    out("")
    out("Validation loss after phases %s of the forks, once per document, on a quarter of the "
        "validation documents (drawn once; the table's figures are on all of them):" % curve_text)
    out("")
    out("![loss against inner steps](%s)" % name_steps)
    out("")
    out("![loss against training FLOPs](%s)" % name_flops)
    out("")
    out("The outer steps' diagnostics: for each module, the L2 norm of each path's delta "
        "(module before the phase minus the path's weights after it) and the mean cosine "
        "between the deltas of the paths that share it, averaged over the modules of a level. "
        "Flat MoE's modules have one path each: no cosine.")
    out("")
    out("![outer-step diagnostics](%s)" % name_outer)
    out("")
    out("## Per phase")
    out("")
    out("Validation loss once per document on the quarter split, after phases %s of the forks "
        "(the steps count the base's %d; dense 4S at the same steps of its own run):" % (curve_text, bsteps))
    out("")
    out("| configuration | " + " | ".join("step %d" % ((B + t) * tau) for t in CURVE) + " |")
    # (a row of another step count per phase, dense S at 4x the steps, says so in its label)
    out("|---|" + "--:|" * len(CURVE))
    for name, label, _ in CONFIGS:
        c = runs[name]["curve"]
        if [x[1] for x in c] != [(B + t) * tau for t in CURVE]:
            label += " (at steps %s)" % ", ".join(str(x[1]) for x in c)
        out("| %s | %s |" % (label, " | ".join("%.4f" % x[2] for x in c)))
    out("")
    out("Routing of the training shards (dpc-shard's report: shard sizes, and the agreement of "
        "shards with Brown's 15 categories, against random shards of the same sizes):")
    out("")
    for name, fname, what in (("dipaco-km", "routing.txt", ""), ("dipaco-top2", "routing.txt", ""),
                              ("dipaco-disc", hp, ", after the re-sharding"),
                              ("dipaco-paper", hp, ", after the re-sharding")):
        fn = os.path.join(run, name, fname)
        if os.path.exists(fn):
            txt = open(fn).read().strip()
            if txt:
                out("%s%s:" % (runs[name]["label"], what))
                out("")
                out("```")
                out(txt)
                out("```")
                out("")
    text = "\n".join(page).rstrip("\n") + "\n"
    tmpf = a.output + ".tmp"
    with open(tmpf, "w") as f:
        f.write(text)
    os.replace(tmpf, a.output)
    print("reproduce-report.py: wrote %s and %s, %s, %s" % (a.output, name_steps, name_flops, name_outer))


if __name__ == "__main__":
    main()
