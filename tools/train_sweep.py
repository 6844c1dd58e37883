#!/usr/bin/env python3
"""MHA against BDA at several learning-rate scales of the Noam schedule, over several seeds (the
paper's §5.2 sweep, with the spread one seed cannot show).

Runs examples/train_lm once per (variant, scale, seed) with the same steps and model, one after the
other, and writes into OUT: each run's log and validation curve, results.json (every run's final
JSON line), table.md (docs/training.md's table: mean ± standard deviation over the seeds of the
final validation loss and of the step time, and each variant's gap to MHA in units of MHA's
spread) and curves.png (each variant's mean validation loss against step, its seeds' range shaded).

  tools/train_sweep.py --train-lm build/examples/train_lm --out docs/train/DATE [--scales 0.5,1,2,4]
                       [--seeds 1,2,3] [--variants mha,bda] [--jobs 2] [-- extra train_lm options, e.g. --steps 1500]

A variant is mha; bda, BDA as its own architecture (the paper's: first-rows windows, B and C drawn
directly; train_lm --attention bda); or bda:BASIS, BDA started from the BD of the MHA model's
initialisation with that basis (train_lm --attention bda --start mha --basis BASIS; bda:first is the
paper's windows from that start, bda:pivoted each head's own rows).
"""
import argparse
import concurrent.futures
import csv
import json
import math
import os
import subprocess
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-lm")
    p.add_argument("--merge", action="store_true",
                   help="add to OUT's results.json and redraw from all of it (no run repeated)")
    p.add_argument("--out", required=True)
    p.add_argument("--scales", default="0.5,1,2,4")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--variants", default="mha,bda")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time (each with train_lm's --threads, e.g. -- --threads 1: on 2 cores two "
                        "one-thread runs train 1.7x the runs per hour of one two-thread run; step times are then "
                        "measured with the runs sharing the machine)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="options passed to every train_lm run (after --)")
    a = p.parse_args()
    extra = [x for x in a.extra if x != "--"]
    if "--seed" in extra:
        sys.exit("train_sweep: give the seeds with --seeds, not --seed after --")
    os.makedirs(a.out, exist_ok=True)
    results = []
    previous = os.path.join(a.out, "results.json")
    if a.merge and os.path.exists(previous):
        with open(previous) as f:
            before = json.load(f)
        results = before["runs"]
        extra = extra or before.get("extra", [])  # a redraw keeps the options the runs had
        for r in results:
            if "run" not in r:  # from before seeds and --start: one seed, files named by the variant's old name
                old = r.get("variant") or (r["attention"] if r.get("basis", "first") in ("first", "-")
                                           else "%s:%s" % (r["attention"], r["basis"]))
                r["run"] = "%s-%g" % (old.replace(":", "-"), r["lr_scale"])
                r["variant"] = variant_of(r)
    if not a.train_lm:
        a.variants, a.scales, a.seeds = "", "", ""
    start = time.time()
    done = {r["run"] for r in results}
    tasks = []
    for seed in [int(s) for s in a.seeds.split(",") if s]:  # seed outermost: a sweep cut short has whole seeds
        for scale in [float(s) for s in a.scales.split(",") if s]:
            for variant in [v for v in a.variants.split(",") if v]:
                run_name = "%s-%g-s%d" % (variant.replace(":", "-"), scale, seed)
                if run_name not in done:  # --merge resumes a sweep: a run already in results.json is kept
                    tasks.append((variant, scale, seed, run_name))
    lock = threading.Lock()

    def run_one(task):
        variant, scale, seed, run_name = task
        attention, _, basis = variant.partition(":")
        curve = os.path.join(a.out, run_name + ".csv")
        cmd = [a.train_lm, "--attention", attention, "--lr-scale", str(scale), "--seed", str(seed),
               "--eval-every", str(a.eval_every), "--curve", curve]
        if basis:
            cmd += ["--start", "mha", "--basis", basis]
        cmd += extra
        print("$ " + " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        with open(os.path.join(a.out, run_name + ".log"), "w") as log:
            log.write(run.stdout + run.stderr)
        if run.returncode != 0:
            print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
            raise RuntimeError("train_lm failed for %s" % run_name)
        j = json.loads(run.stdout.strip().splitlines()[-1])
        j["variant"], j["run"], j["jobs"] = variant, run_name, a.jobs
        print("  %s: val loss %.4f (ppl %.3f), %.1f ms/step" % (run_name, j["val_loss"], j["val_ppl"], j["ms_per_step"]),
              flush=True)
        with lock:  # results.json after every run: an interrupted sweep resumes with --merge
            results.append(j)
            save(results, a.out, time.time() - start, extra)
        return j

    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for future in [pool.submit(run_one, t) for t in tasks]:
            try:
                future.result()
            except RuntimeError as e:
                sys.exit("train_sweep: %s" % e)
    order = {r["run"]: i for i, r in enumerate(results)}
    results.sort(key=lambda r: (r["lr_scale"], order[r["run"]]))
    save(results, a.out, time.time() - start, extra)
    write_table(results, os.path.join(a.out, "table.md"))
    plot(results, a.out)


def save(results, out, seconds, extra):
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"runs": results, "seconds": seconds, "extra": extra}, f, indent=1)
    os.replace(path + ".tmp", path)


def variant_of(r):
    """A run's variant from its JSON line; lines from before train_lm's --start were all MHA-started."""
    if r["attention"] != "bda":
        return r["attention"]
    if r.get("start", "mha") == "own":
        return "bda"
    return "bda:%s" % r.get("basis", "first")


def ordered_variants(results):
    """MHA first (the baseline every gap is read against), then the others as they first appear."""
    variants = list(dict.fromkeys(r["variant"] for r in results))
    return sorted(variants, key=lambda v: v != "mha")


def label(variant):
    attention, _, basis = variant.partition(":")
    if attention == "bda" and basis:
        return "BDA from MHA (%s)" % basis
    return attention.upper()


def stats(values):
    """Mean and sample standard deviation (None for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return mean, sd


def mean_sd(values, digits):
    mean, sd = stats(values)
    return ("%.*f" % (digits, mean)) + ("" if sd is None else (" ± %.*f" % (digits, sd)))


def write_table(results, path):
    """One row per LR scale: each variant's final validation loss and step time over its seeds
    (mean ± sd, n), and its gap to MHA's mean, relative and in MHA's standard deviations."""
    variants = ordered_variants(results)
    runs = {}
    for r in results:
        runs.setdefault((r["variant"], r["lr_scale"]), []).append(r)
    scales = sorted({r["lr_scale"] for r in results})
    head = ["LR scale"]
    for v in variants:
        head += ["%s val loss" % label(v)] + ([] if v == "mha" else ["vs MHA"]) + ["%s ms/step" % label(v)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in scales:
        row = ["%g" % s]
        mha = [r["val_loss"] for r in runs.get(("mha", s), [])]
        for v in variants:
            rs = runs.get((v, s))
            if not rs:
                row += ["-"] * (2 if v == "mha" else 3)
                continue
            loss = [r["val_loss"] for r in rs]
            row.append("%s (n = %d)" % (mean_sd(loss, 4), len(loss)))
            if v != "mha":
                if mha:
                    m, sd = stats(mha)
                    gap = stats(loss)[0] - m
                    row.append("%+.1f %%" % (100 * gap / m) + ("" if not sd else ", %+.1f sd" % (gap / sd)))
                else:
                    row.append("-")
            row.append(mean_sd([r["ms_per_step"] for r in rs], 1))
        lines.append("| " + " | ".join(row) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(results, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("matplotlib not found (Debian: python3-matplotlib): no curves.png", file=sys.stderr)
        return
    variants = ordered_variants(results)
    scales = sorted({r["lr_scale"] for r in results})
    groups = {}
    for r in results:
        groups.setdefault((r["variant"], r["lr_scale"]), []).append(r)
    # One panel per LR scale, one colour per variant: the seeds' mean as a line, their range shaded.
    cols = min(2, len(scales))
    rows = (len(scales) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False, sharey=True)
    for k, scale in enumerate(scales):
        ax = axes[k // cols][k % cols]
        for i, variant in enumerate(variants):
            rs = groups.get((variant, scale))
            if not rs:
                continue
            curves = []
            for r in rs:
                with open(os.path.join(out, r["run"] + ".csv")) as f:
                    curves.append({int(row["step"]): float(row["val_loss"]) for row in csv.DictReader(f)})
            steps = [t for t in sorted(set.intersection(*[set(c) for c in curves])) if t > 0]
            mean = [sum(c[t] for c in curves) / len(curves) for t in steps]
            ax.plot(steps, mean, color="C%d" % i, linewidth=1.2,
                    label="%s (%d seed%s)" % (label(variant), len(curves), "" if len(curves) == 1 else "s"))
            if len(curves) > 1:
                ax.fill_between(steps, [min(c[t] for c in curves) for t in steps],
                                [max(c[t] for c in curves) for t in steps], color="C%d" % i, alpha=0.2, linewidth=0)
        ax.set_title("LR scale %g" % scale, fontsize=10)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
        ax.grid(alpha=0.3, which="both")
        if k % cols == 0:
            ax.set_ylabel("validation loss (nats/byte)")
        ax.legend(fontsize=7)
    for k in range(len(scales), rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=110)


if __name__ == "__main__":
    main()
