"""How far a sparse step moves the answer: for every decode step of --sparse-attn on, the gap between
its two best tokens against dense's gap between the same two tokens on the same step, and whether
a signal the selection already has says which steps move most.

Input: the JSON lines written by a build with recheck-delta.diff applied, with
LLAMA_SPARSE_RECHECK_PROBE=FILE and --sparse-attn-recheck 100 (every sparse step is computed again
densely, so the generation is dense's and every step has both answers).
Usage: python probes/recheck-delta.py NAME=FILE [NAME=FILE ...]   (a markdown report on stdout)
"""
import json
import sys


def load(path):
    steps, seen = [], set()
    for line in open(path):
        x = json.loads(line)
        # the ab gate's repeats decode the same steps again: keep the first round of each prompt
        key = (x["pos"], x["s1"], round(x["sgap"], 4))
        if key in seen:
            continue
        seen.add(key)
        x["delta"] = x["sgap"] - x["d_s1_s2"]  # sparse's gap less dense's, same two tokens
        x["flip"] = x["d1"] != x["s1"]
        x["read_fraction"] = x["read"] / max(x["visible"], 1)
        x["max_unread_share"] = max(x["lmax"])
        x["sum_unread_share"] = sum(x["lsum"])
        steps.append(x)
    return steps


def rank(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    for k, i in enumerate(order):
        r[i] = float(k)
    return r


def spearman(a, b):
    ra, rb = rank(a), rank(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def quantile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main(args):
    runs = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in args]
    print("| input | steps | abs(delta): median | 90% | max | steps within 0.25 (rechecked) | flips (dense's best differs) | sparse gap of each flip | flips past 0.25 |")
    print("|---|--:|--:|--:|--:|--:|--:|---|--:|")
    for name, s in runs:
        d = [abs(x["delta"]) for x in s]
        flips = [x for x in s if x["flip"]]
        thin = sum(x["sgap"] < 0.25 for x in s)
        flip_gaps = ", ".join(f"{x['sgap']:.3f}" for x in flips) or "-"
        past = sum(x["sgap"] >= 0.25 for x in flips)
        print(f"| {name} | {len(s)} | {quantile(d, 0.5):.2f} | {quantile(d, 0.9):.2f} | {max(d):.2f} | {thin} ({thin / len(s):.1%}) | "
              f"{len(flips)} | {flip_gaps} | {past} |")
    print()
    print("Spearman correlation of abs(delta) with what the selection knows of the step (all steps of each input):")
    print()
    print("| input | read fraction | largest unread share of a query head | unread shares summed |")
    print("|---|--:|--:|--:|")
    for name, s in runs:
        d = [abs(x["delta"]) for x in s]
        cells = [spearman(d, [x[k] for x in s]) for k in ("read_fraction", "max_unread_share", "sum_unread_share")]
        print(f"| {name} | " + " | ".join(f"{c:+.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
