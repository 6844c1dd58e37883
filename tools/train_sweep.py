#!/usr/bin/env python3
"""MHA against BDA at several learning-rate scales of the Noam schedule (the paper's §5.2 sweep).

Runs examples/train_lm once per (attention, scale) with the same seed, steps and model, one after
the other, and writes into OUT: each run's log and validation curve, results.json (every run's
final JSON line), table.md (docs/training.md's table) and curves.png (validation loss against step).

  tools/train_sweep.py --train-lm build/examples/train_lm --out docs/train/DATE [--scales 0.5,1,2,4]
                       [--variants mha,bda] [-- extra train_lm options, e.g. --steps 1500 --layers 2]

A variant is mha, bda (the first-rows basis, the paper's) or bda:BASIS (e.g. bda:pivoted).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-lm")
    p.add_argument("--merge", action="store_true",
                   help="add to OUT's results.json and redraw from all of it (no run repeated)")
    p.add_argument("--out", required=True)
    p.add_argument("--scales", default="0.5,1,2,4")
    p.add_argument("--variants", default="mha,bda")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="options passed to every train_lm run (after --)")
    a = p.parse_args()
    extra = [x for x in a.extra if x != "--"]
    os.makedirs(a.out, exist_ok=True)
    results = []
    previous = os.path.join(a.out, "results.json")
    if a.merge and os.path.exists(previous):
        with open(previous) as f:
            results = json.load(f)["runs"]
        for r in results:
            r.setdefault("variant", r["attention"] if r.get("basis", "first") in ("first", "-") else "%s:%s" % (r["attention"], r["basis"]))
    if not a.train_lm:
        a.variants, a.scales = "", ""
    start = time.time()
    for scale in [float(s) for s in a.scales.split(",") if s]:
        for variant in [v for v in a.variants.split(",") if v]:
            attention, _, basis = variant.partition(":")
            name = "%s-%g" % (variant.replace(":", "-"), scale)
            curve = os.path.join(a.out, name + ".csv")
            cmd = [a.train_lm, "--attention", attention, "--lr-scale", str(scale), "--eval-every", str(a.eval_every),
                   "--curve", curve] + (["--basis", basis] if basis else []) + extra
            print("$ " + " ".join(cmd), flush=True)
            run = subprocess.run(cmd, capture_output=True, text=True)
            with open(os.path.join(a.out, name + ".log"), "w") as log:
                log.write(run.stdout + run.stderr)
            if run.returncode != 0:
                print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
                sys.exit("train_lm failed for %s" % name)
            j = json.loads(run.stdout.strip().splitlines()[-1])
            j["variant"] = variant
            print("  val loss %.4f (ppl %.3f), %.1f ms/step" % (j["val_loss"], j["val_ppl"], j["ms_per_step"]), flush=True)
            results.append(j)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": results, "seconds": time.time() - start, "extra": extra}, f, indent=1)
    write_table(results, os.path.join(a.out, "table.md"))
    plot(results, a.out)


def label(variant):
    attention, _, basis = variant.partition(":")
    return attention.upper() + (" (%s)" % basis if basis else "")


def write_table(results, path):
    """One row per LR scale: each variant's validation loss and perplexity, its gap to MHA's, its step time."""
    variants = list(dict.fromkeys(r.get("variant", r["attention"]) for r in results))
    by = {(r.get("variant", r["attention"]), r["lr_scale"]): r for r in results}
    scales = sorted({r["lr_scale"] for r in results})
    head = ["LR scale"]
    for v in variants:
        head += ["%s val loss (ppl)" % label(v)] + ([] if v == "mha" else ["vs MHA"]) + ["%s ms/step" % label(v)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in scales:
        row = ["%g" % s]
        mha = by.get(("mha", s))
        for v in variants:
            r = by.get((v, s))
            if not r:
                row += ["-"] * (2 if v == "mha" else 3)
                continue
            row.append("%.4f (%.3f)" % (r["val_loss"], r["val_ppl"]))
            if v != "mha":
                row.append("%+.1f %%" % (100 * (r["val_loss"] - mha["val_loss"]) / mha["val_loss"]) if mha else "-")
            row.append("%.1f" % r["ms_per_step"])
        lines.append("| " + " | ".join(row) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(results, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found (Debian: python3-matplotlib): no curves.png", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {}
    styles = ["-", "--", ":", "-."]
    variants = list(dict.fromkeys(r.get("variant", r["attention"]) for r in results))
    for r in results:
        variant = r.get("variant", r["attention"])
        name = "%s-%g" % (variant.replace(":", "-"), r["lr_scale"])
        steps, val = [], []
        with open(os.path.join(out, name + ".csv")) as f:
            for row in csv.DictReader(f):
                steps.append(int(row["step"]))
                val.append(float(row["val_loss"]))
        color = colors.setdefault(r["lr_scale"], "C%d" % len(colors))
        ax.plot(steps, val, color=color, linestyle=styles[variants.index(variant) % len(styles)],
                label="%s, LR scale %g" % (label(variant), r["lr_scale"]))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title("validation loss: " + ", ".join("%s (%s)" % (label(v), styles[i % len(styles)]) for i, v in enumerate(variants)),
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=110)


if __name__ == "__main__":
    main()
