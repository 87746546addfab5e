#!/usr/bin/python3
"""genres.py - a labelled JSON Lines corpus of three "genres" with disjoint byte statistics,
for the routing tests: digit groups, uppercase words and lowercase prose, document i of genre
i % 3 (or all of --only), with its genre as "category" (and "id": i with --ids).

usage: genres.py OUT.jsonl N [--seed S] [--only GENRE] [--min L] [--max L] [--ids]
"""
import argparse
import json
import random

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his "
         "from at which but have an they you were her she there one all we their been has "
         "river garden model path city token corpus").split()
GENRES = ["digits", "upper", "prose"]


def text(rng, g, n):
    s = ""
    while len(s) < n:
        if g == "digits":
            s += "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6))) + " "
        elif g == "upper":
            s += "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                         for _ in range(rng.randint(2, 8))) + " "
        else:
            s += rng.choice(WORDS) + rng.choice("   ,.")
    return s[:n]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("n", type=int)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--only", choices=GENRES)
    p.add_argument("--min", type=int, default=150)
    p.add_argument("--max", type=int, default=400)
    p.add_argument("--ids", action="store_true")
    a = p.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for i in range(a.n):
            g = a.only or GENRES[i % 3]
            d = {"text": text(rng, g, rng.randint(a.min, a.max)), "category": g}
            if a.ids:
                d["id"] = i
            f.write(json.dumps(d) + "\n")


if __name__ == "__main__":
    main()
