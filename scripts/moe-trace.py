#!/usr/bin/python3
"""moe-trace.py - the capacity an MoE GPT's training asked for, step by step, as a trace that
moe-bench replays (--trace, --dict), and optionally as a plot.

    scripts/moe-trace.py METRICS [-o TRACE] [--block B] [--plot PNG]

METRICS is a dpc-train-path metrics.jsonl of a model with MoE blocks (dpc-config(5), "Section
moe"): each training step writes one "moe" event per MoE block with the tokens N it routed,
its experts E, top-k, the capacity C it used and the largest expert count `need` (what a
capacity setting of 0 would have given). For each step, the trace gets the smallest capacity
setting x whose capacity C(x) = k * int(x * ceil(N / E)) (moe.h, Tutel's) holds `need`: the
step's routing run with x drops nothing and wastes no slot. By default the step's largest
over its MoE blocks; --block B takes that block's alone. The trace's header comments name the
run, the block and the moe-bench line that replays it on the same shape (-T N -E E -k k; the
model's width for -M, 4 x that for -H).

--plot PNG draws each block's needed factor (need x E / (N k), the capacity the routing asked
for relative to a perfectly balanced one) per step, with gnuplot (Debian: gnuplot-nox).

Errors (exit 1, one line naming the file): no such file, a line that is not JSON, no "moe"
event (a dense run), steps whose events disagree on N, E or k, a --block the run does not
have. Exit 2: usage.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

PROG = "moe-trace.py"


def die(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def setting_for(need, n, e, k):
    """The smallest x > 0 with k * int(x * ceil(n / e)) >= need, computed as the C code will
    compute it (a double product truncated toward zero), so the replay reaches `need`."""
    per = -(-n // e)
    slots = -(-need // k)  # int(x * per) must reach this
    x = slots / per
    while k * int(x * per) < need:
        x = math.nextafter(x, math.inf)
    return x


def read_events(path):
    try:
        f = open(path)
    except OSError as err:
        die(f"'{path}': {err.strerror}")
    steps = {}
    with f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                die(f"'{path}': line {i} is not JSON")
            if ev.get("event") != "moe":
                continue
            try:
                key = (int(ev["step"]), int(ev["block"]))
                steps[key] = {k: ev[k] for k in ("tokens", "experts", "top_k", "capacity",
                                                  "need", "need_factor", "dropped")}
            except (KeyError, TypeError, ValueError):
                die(f"'{path}': line {i}: a moe event without step, block, tokens, experts, "
                    f"top_k, capacity, need, need_factor and dropped")
    if not steps:
        die(f"'{path}': no \"moe\" event: not the metrics of a model with MoE blocks")
    return steps


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics")
    ap.add_argument("-o", "--out", help="the trace (default: stdout)")
    ap.add_argument("--block", type=int, help="one MoE block's trace (default: the largest "
                    "over the blocks at each step)")
    ap.add_argument("--plot", help="a PNG of the needed factor per step and block")
    a = ap.parse_args()
    ev = read_events(a.metrics)
    blocks = sorted({b for _, b in ev})
    if a.block is not None and a.block not in blocks:
        die(f"'{a.metrics}': block {a.block} is not an MoE block of the run (those are "
            f"{', '.join(map(str, blocks))})")
    shape = {(v["tokens"], v["experts"], v["top_k"]) for v in ev.values()}
    if len(shape) != 1:
        die(f"'{a.metrics}': the steps routed different shapes (tokens, experts, top-k: "
            f"{sorted(shape)}); a trace replays one")
    n, e, k = shape.pop()
    steps = sorted({s for s, _ in ev})
    use = [a.block] if a.block is not None else blocks
    lines = [f"# capacity trace of {os.path.abspath(a.metrics)}: {len(steps)} steps, "
             f"{'block ' + str(a.block) if a.block is not None else 'the largest over blocks ' + ','.join(map(str, blocks))}",
             f"# each line: the smallest capacity setting that drops nothing at that step",
             f"# replay: moe-bench -T {n} -E {e} -k {k} -M C -H 4C --trace THIS (C: the model's "
             f"n_embd)"]
    for s in steps:
        need = max(ev[(s, b)]["need"] for b in use if (s, b) in ev)
        lines.append(repr(setting_for(need, n, e, k)))
    text = "\n".join(lines) + "\n"
    if a.out:
        tmp = f"{a.out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
    else:
        sys.stdout.write(text)
    if a.plot:
        with tempfile.TemporaryDirectory() as d:
            cmds = ["set terminal pngcairo size 1000,500 noenhanced",
                    f"set output '{a.plot}.tmp'",
                    f"set title 'capacity asked for per step: {os.path.basename(a.metrics)} "
                    f"(N={n} E={e} k={k})'",
                    "set xlabel 'step'", "set ylabel 'need x E / (N k)'", "set key outside",
                    "set grid"]
            plots = []
            for b in blocks:
                p = os.path.join(d, f"b{b}.dat")
                with open(p, "w") as f:
                    for s in steps:
                        if (s, b) in ev:
                            f.write(f"{s} {ev[(s, b)]['need_factor']}\n")
                plots.append(f"'{p}' with lines title 'block {b}'")
            cmds.append("plot " + ", ".join(plots))
            try:
                subprocess.run(["gnuplot"], input="\n".join(cmds), text=True, check=True)
            except FileNotFoundError:
                die("gnuplot not found (apt-get install gnuplot-nox)")
            except subprocess.CalledProcessError:
                die(f"gnuplot failed drawing '{a.plot}'")
            os.replace(a.plot + ".tmp", a.plot)


if __name__ == "__main__":
    main()
