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
    ("dense-s", "dense S", "one path of gpt-tiny; the routers' base model"),
    ("dense-s-seed2", "dense S, seed 2", "the same, another seed: the noise floor"),
    ("dense-s-seed3", "dense S, seed 3", "the same, another seed"),
    ("dense-s-seed4", "dense S, seed 4", "the same, another seed"),
    ("dense-4s", "dense 4S", "one path, width doubled: 3.9x the parameters; the shared learning rate"),
    ("dense-4s-halflr", "dense 4S, half the learning rate",
     "the same at half the learning rate (Adam's rate scaled as 1/width)"),
    ("diloco", "DiLoCo, 4 workers", "random shards, one module shared by all"),
    ("flat-moe", "flat MoE, 4 paths", "k-means shards, nothing shared"),
    ("dipaco-km", "DiPaCo 2x2", "k-means shards"),
    ("dipaco-top2", "DiPaCo 2x2, top-2 shards", "each document in its 2 best k-means shards"),
    ("dipaco-disc", "DiPaCo 2x2, re-sharded", "discriminative re-sharding after half the phases"),
    ("dipaco-head", "DiPaCo 2x2 + path-specific level", "last block and head: one module per path"),
]


# one colour per configuration, the same in every plot
COLOURS = ["#1f77b4", "#7f7f7f", "#a0a0a0", "#c0c0c0", "#000000", "#505050", "#ff7f0e",
           "#8c564b", "#d62728", "#2ca02c", "#9467bd", "#17becf"]
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
                m = re.match(r"^\s+(\w+):\s*([-0-9.eE+]+)\s*$", line)
                if m and m.group(1) not in vals:
                    vals[m.group(1)] = float(m.group(2))
    except OSError as e:
        die("%s: %s" % (path, e))
    for k in ("n_layer", "n_embd", "seq_len", "batch_size", "steps", "phases", "inner_steps", "lr",
              "outer_lr", "outer_momentum"):
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


def main():
    ap = argparse.ArgumentParser(description="the results page of scripts/reproduce.sh")
    ap.add_argument("--run", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    run = a.run
    settings = dict(s.split("=", 1) for s in read_text(os.path.join(run, "settings")).split())
    runs = {}
    for name, label, what in CONFIGS:
        d = os.path.join(run, name)
        cv = config_values(os.path.join(d, "config.yaml"))
        topo = load_json(os.path.join(d, "topology.json"))
        pev, oev = read_metrics(os.path.join(d, "metrics.jsonl"))
        wall = read_text(os.path.join(d, "wall")).split()
        T = int(cv["phases"])
        tau = int(cv["inner_steps"])
        P = topo["paths"]
        tokens_per_path = cv["steps"] * cv["batch_size"] * cv["seq_len"]
        tokens = P * tokens_per_path
        # per token, forward and backward: 6 N, and 12 L C T for attention (PaLM's count)
        per_token = 6 * topo["params_per_path"] + 12 * cv["n_layer"] * cv["n_embd"] * cv["seq_len"]
        final = load_json(os.path.join(run, "eval", name + "-final.json"))
        curve = []
        for t in range(1, T + 1):
            ev = load_json(os.path.join(run, "eval", "%s-curve-%d.json" % (name, t)))
            curve.append((t, t * tau, mode(ev, 0)["loss"]))
        runs[name] = dict(
            label=label, what=what, cv=cv, topo=topo, paths=pev, outer=oev, T=T, tau=tau, P=P,
            tokens=tokens, flops=tokens * per_token, wall=int(wall[0]), resumed=wall[3] == "yes",
            workers="%s x %s" % (wall[1], wall[2]), final=final, curve=curve,
            doc=mode(final, 0), win=mode(final, 64))
    kmdisc = load_json(os.path.join(run, "eval", "dipaco-km-disc-final.json"))
    check_scored([(n + "-final", r["final"]) for n, r in runs.items()] +
                 [("dipaco-km-disc-final", kmdisc)], "the validation split")
    check_scored([("%s-curve-%d" % (n, t), load_json(os.path.join(run, "eval", "%s-curve-%d.json" % (n, t))))
                  for n, r in runs.items() for t in range(1, r["T"] + 1)], "the quarter split")

    L = {n: r["doc"]["loss"] for n, r in runs.items()}
    # the noise floor: twice the standard deviation of dense S's loss over its 4 seeds
    seeds = [L[n] for n in ("dense-s", "dense-s-seed2", "dense-s-seed3", "dense-s-seed4")]
    mean = sum(seeds) / len(seeds)
    noise = 2 * (sum((x - mean) ** 2 for x in seeds) / (len(seeds) - 1)) ** 0.5
    page = []
    out = page.append
    T, tau = runs["dense-s"]["T"], runs["dense-s"]["tau"]
    quick = settings.get("quick") == "1"
    out("# DiPaCo on Brown: the paper's orderings at small scale")
    out("")
    out("Generated by `%s` at commit %s; do not edit by hand." % (a.command, a.commit))
    if quick:
        out("")
        out("**A --quick run**: a model of width %d, %d phases of %d steps. It checks the script, "
            "not the claims." % (runs["dense-s"]["cv"]["n_embd"], T, tau))
    out("")
    out("Every configuration trains for the same number of inner steps per path: %d phases of "
        "%d steps, %d steps in all, each a batch of %d sequences of %d bytes. Data: the Brown "
        "corpus (500 documents, 15 genres), as bytes, documents cut into 1024-byte pieces; "
        "validation %d pieces (%d scored bytes), held out from training and from the routers." % (
            T, tau, T * tau, runs["dense-s"]["cv"]["batch_size"], runs["dense-s"]["cv"]["seq_len"],
            runs["dense-s"]["final"]["docs"], runs["dense-s"]["doc"]["tokens"]))
    out("Losses are nats per byte on the validation split, scored from byte %d of each piece "
        "on (the routers see the first %d bytes). Perplexity is per byte." % (
            runs["dipaco-km"]["final"]["prefix"], runs["dipaco-km"]["final"]["prefix"]))
    out("")
    out("## Results")
    out("")
    out("| configuration | params per path | total params | training FLOPs | tokens seen "
        "| wall s (workers x threads) | val loss, once per doc | ppl | val loss, re-routed every 64 | ppl |")
    out("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")

    def row(label, r, doc, win):
        wl = "%.4f" % win["loss"] if win else "-"
        wp = "%.3f" % win["perplexity"] if win else "-"
        out("| %s | %s | %s | %s | %s | %d%s (%s) | %.4f | %.3f | %s | %s |" % (
            label, fmt_count(r["topo"]["params_per_path"]), fmt_count(r["topo"]["params_total"]),
            "%.2e" % r["flops"], fmt_count(r["tokens"]), r["wall"], "*" if r["resumed"] else "",
            r["workers"], doc["loss"], doc["perplexity"], wl, wp))

    for name, label, what in CONFIGS:
        r = runs[name]
        row(label, r, r["doc"], r["win"])
    r = runs["dipaco-km"]
    row("DiPaCo 2x2, discriminative router at evaluation", r, mode(kmdisc, 0), mode(kmdisc, 64))
    out("")
    out("What each is:")
    out("")
    for name, label, what in CONFIGS:
        out("- **%s**: %s (learning rate %g)." % (label, what, runs[name]["cv"]["lr"]))
    out("- **DiPaCo 2x2, discriminative router at evaluation**: the k-means run's paths, routed "
        "by a discriminative router fitted on their scores of the router split (its training "
        "columns are the k-means run's).")
    out("")
    out("Training FLOPs: 6 N + 12 L C T per token (N parameters of a path, L blocks, width C, "
        "context T), times the tokens seen by all paths. Re-routing needs a window router, so the "
        "one-model runs (dense, DiLoCo, whose four paths are one model after each outer step) "
        "have none. Wall time: the training stage's, in the invocation that finished it%s; "
        "evaluation not included; the re-sharded run's is its second half only, its first "
        "half being DiPaCo 2x2's." % (
            " (* marks a stage that was resumed after an interruption)"
            if any(r["resumed"] for r in runs.values()) else ""))
    out("")

    # The orderings.
    out("## The paper's orderings")
    out("")
    out("Noise floor: dense S trained with 4 seeds ends at %s nats; twice their standard "
        "deviation is **%.4f**. A margin (in the paper's direction, positive when it holds) larger "
        "than that is **held**; a positive one within it is **held, within noise**; a negative one "
        "is **not held** (**within noise** when it is smaller than the floor). Four seeds of one "
        "configuration make a rough floor, and runs of several paths may vary more than one path "
        "does: read small margins as ties." % (", ".join("%.4f" % x for x in seeds), noise))
    out("")
    out("| claim | measured | margin | verdict |")
    out("|---|---|--:|---|")
    verdicts = {}

    def claim(key, text, measured, margin):
        if margin > noise:
            v = "held"
        elif margin > 0:
            v = "held, within noise"
        elif -margin <= noise:
            v = "not held, within noise"
        else:
            v = "not held"
        verdicts[key] = v
        out("| %s | %s | %+.4f | %s |" % (text, measured, margin, v))

    def lv(n):
        return "%.4f" % L[n]

    claim("below-dense", "DiPaCo below dense S", "DiPaCo %s, dense S %s" % (lv("dipaco-km"), lv("dense-s")),
          L["dense-s"] - L["dipaco-km"])
    big = min(("dense-4s", "dense-4s-halflr"), key=lambda n: L[n])
    gap = L["dense-s"] - L[big]
    if gap > 0:
        claim("approach-4s", "DiPaCo approaching dense 4S (closing half the gap or more)",
              "the better dense 4S (%s) %s; DiPaCo closes %.0f%% of dense S's gap to it" % (
                  runs[big]["label"], lv(big), 100 * (L["dense-s"] - L["dipaco-km"]) / gap),
              (L["dense-s"] - L["dipaco-km"]) - 0.5 * gap)
    else:  # no gap to close: the claim's premise, 4S below S, fails; the margin is the gap
        claim("approach-4s", "DiPaCo approaching dense 4S (closing half the gap or more)",
              "the better dense 4S (%s) %s is not below dense S %s: no gap to close" % (
                  runs[big]["label"], lv(big), lv("dense-s")), gap)
    claim("shared-vs-flat", "shared modules beating flat MoE (at 4 paths)",
          "DiPaCo %s, flat MoE %s" % (lv("dipaco-km"), lv("flat-moe")), L["flat-moe"] - L["dipaco-km"])
    claim("top2", "top-2 overlapping shards helping",
          "top-2 %s, top-1 %s" % (lv("dipaco-top2"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-top2"])
    claim("disc", "discriminative re-sharding beating k-means",
          "re-sharded %s, k-means %s" % (lv("dipaco-disc"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-disc"])
    kd = mode(kmdisc, 0)["loss"]
    claim("disc-route", "discriminative routing beating k-means (same paths, routing only)",
          "discriminative %.4f, k-means %s" % (kd, lv("dipaco-km")), L["dipaco-km"] - kd)
    w = runs["dipaco-km"]["win"]["loss"]
    others = ["%s %+.4f" % (runs[n]["label"], runs[n]["doc"]["loss"] - runs[n]["win"]["loss"])
              for n in ("flat-moe", "dipaco-top2", "dipaco-disc", "dipaco-head")]
    claim("reroute", "re-routing every 64 tokens beating once per document",
          "DiPaCo 2x2: %.4f vs %s (the others, once per doc minus re-routed: %s)" % (
              w, lv("dipaco-km"), "; ".join(others)), L["dipaco-km"] - w)
    claim("head", "a path-specific level helping",
          "with %s, without %s" % (lv("dipaco-head"), lv("dipaco-km")), L["dipaco-km"] - L["dipaco-head"])
    claim("diloco", "DiLoCo close to dense at equal steps (within the floor, or below)",
          "DiLoCo %s, dense S %s" % (lv("diloco"), lv("dense-s")),
          noise - (L["diloco"] - L["dense-s"]))
    out("")
    out("The DiLoCo margin is the floor minus DiLoCo's excess over dense S, so it is positive "
        "when DiLoCo is within the floor of dense S or below it.")
    out("")

    # Why, where a claim does not hold.
    cv = runs["dense-s"]["cv"]
    read = T * tau * cv["batch_size"] * cv["seq_len"]  # tokens one path reads

    def shard_tokens(name):
        sh = load_json(os.path.join(run, name, "shards", "shards.json"))["shards"]
        return sum(x["tokens"] for x in sh) / len(sh)

    def val_spread(name, t):
        v = [e["val_loss"] for e in runs[name]["paths"] if e["phase"] == t and e.get("val_loss") is not None]
        return max(v) - min(v) if v else float("nan")

    def split_report(name):
        """NMI against Brown's categories and the documents per shard, from dpc-shard's report."""
        try:
            txt = open(os.path.join(run, name, "routing.txt")).read()
        except OSError:
            return None, []
        m = re.search(r"NMI ([0-9.]+)", txt)
        docs = [int(x) for x in re.findall(r"^  \d+ +(\d+) +\d+$", txt, re.M)]
        return (float(m.group(1)) if m else None), docs

    def shard_compare():
        (kn, kd), (dn, dd) = split_report("dipaco-km"), split_report("dipaco-disc")
        if kn is None or dn is None or not kd or not dd:
            return ""
        return ("Its shards agree %s with Brown's categories than the k-means ones (NMI %.4f "
                "against %.4f) and hold %d to %d documents (k-means: %d to %d)." % (
                    "less" if dn < kn else "as much or more", dn, kn, min(dd), max(dd),
                    min(kd), max(kd)))

    km_sh, top2_sh = shard_tokens("dipaco-km"), shard_tokens("dipaco-top2")
    km_cv = runs["dipaco-km"]["cv"]
    why = {
        "below-dense": "The curves show where DiPaCo loses: after phase 1 it is at %.4f against "
                       "dense S's %.4f, and the later phases close only part of that. Its first "
                       "outer step moves each shared module by %.2f times its paths' mean delta "
                       "(outer learning rate %g, times 1 + %g for Nesterov's first step, times "
                       "sqrt(2) for the rescaling of a module of 2 paths) and overshoots; dense S's "
                       "outer step is a copy. In the paper's runs of many phases that first step "
                       "is a small part of training; here it is one of %d. Beyond that, a path "
                       "sees one quarter of the data for as many steps as dense S sees all of it, "
                       "and at %d steps every model still has most to learn." % (
                           runs["dipaco-km"]["curve"][0][2], runs["dense-s"]["curve"][0][2],
                           km_cv["outer_lr"] * (1 + km_cv["outer_momentum"]) * 2 ** 0.5,
                           km_cv["outer_lr"], km_cv["outer_momentum"], T, T * tau),
        "approach-4s-nogap": "Dense 4S did not get below dense S at either learning rate: "
                             "at %d steps the wider model is still behind or level with the "
                             "narrow one (after each phase, %s against dense S's %s), so there "
                             "is no gap to approach." % (
                                 T * tau, ", ".join("%.4f" % c[2] for c in runs[big]["curve"]),
                                 ", ".join("%.4f" % c[2] for c in runs["dense-s"]["curve"])),
        "approach-4s": "Dense 4S uses its %.1fx parameters on every batch; at this many steps, "
                       "capacity used on every token counts more than capacity split by topic." % (
                           runs["dense-4s"]["topo"]["params_per_path"] / runs["dense-s"]["topo"]["params_per_path"]),
        "shared-vs-flat": "The paper's gap comes from flat experts overfitting small shards as paths "
                          "multiply (256 there). Here a k-means shard holds %s tokens on average and "
                          "a path reads %s of them: %.2f epochs, too few to overfit, so sharing has "
                          "nothing to prevent." % (fmt_count(km_sh), fmt_count(read), read / km_sh),
        "top2": "Overlap helps when shards are small enough to be repeated: a top-2 shard holds "
                "%s tokens on average (top-1: %s) and a path reads %s, %.2f epochs of a top-1 "
                "shard, so no path runs out of fresh data; overlap only makes paths less "
                "specialised." % (fmt_count(top2_sh), fmt_count(km_sh), fmt_count(read), read / km_sh),
        "disc": "The discriminative router learns each document's best path from the paths after "
                "phase %d, whose validation losses then spanned only %.4f nats: labels from paths "
                "that barely differ are mostly noise. %s" % (
                    T // 2, val_spread("dipaco-km", T // 2), shard_compare()),
        "disc-route": "After the last phase the k-means run's paths' validation losses span %.4f "
                      "nats; the best path of a document differs from the others by less than its "
                      "first 128 bytes can predict." % val_spread("dipaco-km", T),
        "reroute": "The window router switched paths %.2f times per 1024-byte piece; a piece of "
                   "Brown is one text of one genre, and paths that differ by a few hundredths of a "
                   "nat give little to win from a switch, while each switch restarts the context on "
                   "the new path." % runs["dipaco-km"]["win"]["switches_per_doc"],
        "head": "The path-specific level gives each path %s parameters of its own, trained by one "
                "path's steps instead of two; at this scale the shared, better-trained block is "
                "worth more than the specialised one." % fmt_count(
                    [m for m in runs["dipaco-head"]["topo"]["module_list"]
                     if m["level"] == "head"][0]["params"]),
        "diloco": "DiLoCo's outer step averages the 4 workers' deltas and moves by them with "
                  "Nesterov momentum; over %d phases the momentum has little time to build, and the "
                  "average of 4 deltas is shorter than one worker's." % T,
    }
    failed = [k for k, v in verdicts.items() if not v.startswith("held")]
    if failed:
        out("### Where an ordering does not hold, and why we think so")
        out("")
        for k in failed:
            out("- **%s**: %s" % (k, why[k + "-nogap"] if k == "approach-4s" and gap <= 0 else why[k]))
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
                for t, steps, loss in r["curve"]:
                    f.write("%d %.6e %.6f\n" % (steps, r["flops"] * t / r["T"], loss))
            series.append((fn, label, i + 1))
        common = ("set terminal pngcairo size 1000,600 noenhanced\n"
                  "set grid; set key outside right\n"
                  "set ylabel 'validation loss, once per document (nats/byte)'\n")
        plot = ", ".join("'%s' using %%s with linespoints lw 2 pt 7 lc rgb '%s' title \"%s\"" % (
            fn, COLOURS[c - 1], lab) for fn, lab, c in series)
        gnuplot(common + "set output '%s'\nset title 'validation loss against inner steps per path "
                "(a quarter of the validation split)'\nset xlabel 'inner steps per path'\n"
                "plot %s\n" % (name_steps, plot.replace("%s", "1:3")), where)
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
    out("Validation loss after every phase, once per document, on a quarter of the validation "
        "documents (drawn once; the table's figures are on all of them):")
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
    out("Validation loss once per document on the quarter split, after each phase:")
    out("")
    out("| configuration | " + " | ".join("phase %d" % t for t in range(1, T + 1)) + " |")
    out("|---|" + "--:|" * T)
    for name, label, _ in CONFIGS:
        out("| %s | %s |" % (label, " | ".join("%.4f" % l for _, _, l in runs[name]["curve"])))
    out("")
    out("Routing of the training shards (dpc-shard's report: shard sizes, and the agreement of "
        "shards with Brown's 15 categories, against random shards of the same sizes):")
    out("")
    for name in ("dipaco-km", "dipaco-top2", "dipaco-disc"):
        fn = os.path.join(run, name, "routing.txt")
        if os.path.exists(fn):
            txt = open(fn).read().strip()
            if txt:
                out("%s:" % runs[name]["label"])
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
