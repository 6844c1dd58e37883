#!/usr/bin/env python3
"""MHA against BDA at several learning-rate scales of the Noam schedule (the paper's §5.2 sweep).

Runs examples/train_lm once per (attention, scale) with the same seed, steps and model, one after
the other, and writes into OUT: each run's log and validation curve, results.json (every run's
final JSON line), table.md (the README's table) and curves.png (validation loss against step).

  tools/train_sweep.py --train-lm build/examples/train_lm --out docs/train/DATE [--scales 0.5,1,2,4]
                       [-- extra train_lm options, e.g. --steps 1500 --layers 2]
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
    p.add_argument("--train-lm", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--scales", default="0.5,1,2,4")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="options passed to every train_lm run (after --)")
    a = p.parse_args()
    extra = [x for x in a.extra if x != "--"]
    os.makedirs(a.out, exist_ok=True)
    results = []
    start = time.time()
    for scale in [float(s) for s in a.scales.split(",")]:
        for attention in ("mha", "bda"):
            name = "%s-%g" % (attention, scale)
            curve = os.path.join(a.out, name + ".csv")
            cmd = [a.train_lm, "--attention", attention, "--lr-scale", str(scale), "--eval-every", str(a.eval_every),
                   "--curve", curve] + extra
            print("$ " + " ".join(cmd), flush=True)
            run = subprocess.run(cmd, capture_output=True, text=True)
            with open(os.path.join(a.out, name + ".log"), "w") as log:
                log.write(run.stdout + run.stderr)
            if run.returncode != 0:
                print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
                sys.exit("train_lm failed for %s" % name)
            j = json.loads(run.stdout.strip().splitlines()[-1])
            print("  val loss %.4f (ppl %.3f), %.1f ms/step" % (j["val_loss"], j["val_ppl"], j["ms_per_step"]), flush=True)
            results.append(j)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": results, "seconds": time.time() - start, "extra": extra}, f, indent=1)
    write_table(results, os.path.join(a.out, "table.md"))
    plot(results, a.out)


def write_table(results, path):
    by = {(r["attention"], r["lr_scale"]): r for r in results}
    scales = sorted({r["lr_scale"] for r in results})
    lines = ["| LR scale | MHA val loss | BDA val loss | BDA − MHA | MHA val ppl | BDA val ppl | MHA ms/step | BDA ms/step |",
             "|---|---|---|---|---|---|---|---|"]
    for s in scales:
        m, b = by.get(("mha", s)), by.get(("bda", s))
        if not m or not b:
            continue
        lines.append("| %g | %.4f | %.4f | %+.2f %% | %.3f | %.3f | %.1f | %.1f |" % (
            s, m["val_loss"], b["val_loss"], 100 * (b["val_loss"] - m["val_loss"]) / m["val_loss"], m["val_ppl"],
            b["val_ppl"], m["ms_per_step"], b["ms_per_step"]))
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
    for r in results:
        name = "%s-%g" % (r["attention"], r["lr_scale"])
        steps, val = [], []
        with open(os.path.join(out, name + ".csv")) as f:
            for row in csv.DictReader(f):
                steps.append(int(row["step"]))
                val.append(float(row["val_loss"]))
        color = colors.setdefault(r["lr_scale"], "C%d" % len(colors))
        ax.plot(steps, val, color=color, linestyle="-" if r["attention"] == "mha" else "--",
                label="%s, LR scale %g" % (r["attention"].upper(), r["lr_scale"]))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title("MHA (solid) against BDA (dashed), byte-level LM on the King James Bible")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=110)


if __name__ == "__main__":
    main()
