"""End-to-end benchmarks: step time on a throttled network, and convergence, side by side.

    python scripts/bench_e2e.py network [--quick]       (as root: makes a network namespace)
    python scripts/bench_e2e.py convergence [--quick]
    python scripts/bench_e2e.py hosts                   (as root: 2 emulated hosts x 2 ranks)
    python scripts/bench_e2e.py synthetic               (Horovod's ResNet-50 synthetic benchmark)

network: for each link rate, a namespace whose loopback is shaped by tc (tbf, mtu 1500) runs
2-rank horovodrun jobs of torch/bench_step.py for every workload and configuration; the
namespace is removed afterwards, also on failure or Ctrl-C. hosts: the wide MLP on 2 hosts x 2
ranks (scripts/two_hosts.py), the link between hosts shaped to 1 Gbit/s, flat and hierarchical
DeepReduce beside dense and fp16. convergence: every configuration
trains the digits CNN and the LSTM language model for the same budget. Both write JSON, a
markdown table and a PNG into docs/.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PY = sys.executable
HOROVODRUN = str(Path(PY).parent / "horovodrun")
NAMESPACE = "deepreduce-bench"

# untimed steps: the time-aware planner's exploration (3 warm steps, 3 per candidate: 15) and
# the step guard's first comparison (two visits of 3 steps to each of its 5 arms, the middle
# arm's one visit of 5: 29, and 2 more of the plan where the dense arms' verdict changed the
# plan's dense kind)
WARMUP = 46
CONFIGS = {
    "DeepReduce default": ["--compression", "deepreduce"],
    "dense fp32": ["--compression", "none"],
    "fp16": ["--compression", "fp16"],
    "top-k raw pairs": ["--compression", "deepreduce", "--index", "raw", "--value", "raw"],
    "golomb+fp16": ["--compression", "deepreduce", "--index", "golomb", "--value", "fp16"],
    "golomb+qsgd": ["--compression", "deepreduce", "--index", "golomb", "--value", "qsgd"],
    "entropy+entropy": ["--compression", "deepreduce", "--index", "entropy", "--value", "entropy"],
    "bloom+qsgd": ["--compression", "deepreduce", "--index", "bloom", "--value", "qsgd"],
    "DDP PowerSGD r1": ["--peer", "powersgd", "--powersgd-rank", "1"],
    "DDP PowerSGD r4": ["--peer", "powersgd", "--powersgd-rank", "4"],
    "compute only": ["--peer", "compute"],
}
FIXED = ["top-k raw pairs", "golomb+fp16", "golomb+qsgd", "entropy+entropy", "bloom+qsgd"]
QUICK_CONFIGS = ["DeepReduce default", "dense fp32", "fp16", "golomb+fp16", "DDP PowerSGD r1",
                 "compute only"]
WORKLOADS = {"digits CNN": ["--workload", "cnn"], "wide MLP": ["--workload", "mlp"],
             "LSTM LM": ["--workload", "lstm"]}
# the LSTM's embedding gradient is sparse by nature: fixed pipelines send its non-zeros
# (threshold 0); the default keeps its own sparsifier (top-k 1%)
WORKLOAD_FIXED = {"LSTM LM": ["--sparsifier", "threshold"]}
LINKS = {"1 Gbit/s": "1gbit", "100 Mbit/s": "100mbit"}
HOST_CONFIGS = {
    "dense fp32": CONFIGS["dense fp32"],
    "fp16": CONFIGS["fp16"],
    "DeepReduce default, flat": CONFIGS["DeepReduce default"],
    "DeepReduce default, hierarchical": [*CONFIGS["DeepReduce default"], "--hierarchical"],
    "golomb+fp16, flat": CONFIGS["golomb+fp16"],
    "golomb+fp16, hierarchical": [*CONFIGS["golomb+fp16"], "--hierarchical"],
    "compute only": CONFIGS["compute only"],
}


def markdown_table(header, align, rows):
    """A markdown table (align: one of "l"/"r" per column)."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def write_table(stem, header, align, rows):
    """docs/<stem>.md: a markdown table; printed too."""
    text = markdown_table(header, align, rows)
    (DOCS / f"{stem}.md").write_text(text + "\n")
    print(text)


def run(cmd, timeout, netns=False):
    if netns:
        cmd = ["ip", "netns", "exec", NAMESPACE, *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}")
    return proc.stdout


def shaped_namespace(rate):
    """(Re)create the namespace with loopback shaped to `rate`."""
    remove_namespace()
    for cmd in (["ip", "netns", "add", NAMESPACE],
                ["ip", "netns", "exec", NAMESPACE, "ip", "link", "set", "lo", "mtu", "1500", "up"],
                ["ip", "netns", "exec", NAMESPACE, "tc", "qdisc", "add", "dev", "lo", "root",
                 "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]):
        subprocess.run(cmd, check=True)


def remove_namespace():
    subprocess.run(["ip", "netns", "delete", NAMESPACE], stderr=subprocess.DEVNULL)


def saved_run(job, ranks, args, timeout, netns=True, cycle_ms=None):
    """One horovodrun of `job` (a path from the root) with `--json` to a scratch file, in the
    shaped namespace by default (cycle_ms: Horovod's --cycle-time-ms, else its default) ->
    what the job saved there (rank 0's)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "history.json"
        cycle = ["--cycle-time-ms", str(cycle_ms)] if cycle_ms else []
        run([HOROVODRUN, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *cycle, PY,
             str(ROOT / job), *map(str, [*args, "--json", out])], timeout, netns)
        return json.loads(out.read_text())


def network(quick, repeats):
    if os.geteuid() != 0:
        sys.exit("bench-e2e needs root (it creates a network namespace and a tc qdisc)")
    configs = QUICK_CONFIGS if quick else list(CONFIGS)
    workloads = ["wide MLP"] if quick else list(WORKLOADS)
    steps = 8 if quick else 10
    results = []
    try:
        for link, rate in LINKS.items():
            shaped_namespace(rate)
            for workload in workloads:
                for config in configs:
                    result = step_time(workload, config, steps, repeats)
                    results.append({"link": link, "workload": workload, "config": config, **result})
                    print(f"{link:>11} | {workload:<10} | {config:<18} | "
                          f"{result['median_step_s'] * 1e3:8.1f} ms/step | "
                          f"{result['bytes_per_step'] / 1e6:8.3f} MB/step", flush=True)
    finally:
        remove_namespace()
    report_network(results, quick)


def step_time(workload, config, steps, repeats, tries=2):
    """bench_step.py's result, the median over `repeats` runs (this VM's step times vary from
    run to run more than within one); a failed run is retried once, then reported, not fatal."""
    args = [*WORKLOADS[workload], *CONFIGS[config], "--steps", steps, "--warmup", WARMUP]
    if config in FIXED:
        args += WORKLOAD_FIXED.get(workload, [])
    runs = []
    for _ in range(repeats):
        for attempt in range(tries):
            try:
                runs.append(saved_run("torch/bench_step.py", 2, args, 900))
                break
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"run failed (try {attempt + 1}): {str(exc)[:2000]}", flush=True)
    if not runs:
        return {"median_step_s": float("nan"), "bytes_per_step": float("nan"), "failed": True}
    runs.sort(key=lambda r: r["median_step_s"])
    middle = runs[len(runs) // 2]
    return {**middle, "runs_s": [r["median_step_s"] for r in runs]}


def hosts(repeats, rate="1gbit"):
    """Step times on 2 emulated hosts x 2 ranks (the link between hosts at `rate`)."""
    if os.geteuid() != 0:
        sys.exit("bench-e2e hosts needs root (it creates network namespaces)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import two_hosts
    results = []
    try:
        two_hosts.up(rate)
        for config, args in HOST_CONFIGS.items():
            runs = []
            for _ in range(repeats):
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    run(["ip", "netns", "exec", two_hosts.HOSTS["hostA"][0], PY,
                         str(ROOT / "scripts" / "two_hosts.py"), "900", PY,
                         str(ROOT / "torch" / "bench_step.py"), "--workload", "mlp", *args,
                         "--steps", "10", "--warmup", str(WARMUP), "--json", out.name], timeout=1000)
                    runs.append(json.load(open(out.name)))
            runs.sort(key=lambda r: r["median_step_s"])
            result = {"link": f"2 hosts x 2 ranks, {rate} between", "workload": "wide MLP",
                      "config": config, **runs[len(runs) // 2],
                      "runs_s": [r["median_step_s"] for r in runs]}
            results.append(result)
            print(f"{config:<34} | {result['median_step_s'] * 1e3:8.1f} ms/step | "
                  f"{result['bytes_per_step'] / 1e6:8.3f} MB/step | "
                  f"parameters identical: {result['params_identical']}", flush=True)
    finally:
        two_hosts.down()
    results = ratio_rows(results)
    (DOCS / "e2e_hosts.json").write_text(json.dumps({"results": results}, indent=1))
    write_table("e2e_hosts", ["configuration", "median step", "MB sent/step/rank", "vs dense fp32",
                              "vs fp16", "parameters identical on 4 ranks"], "lrrrrl",
                [[r["config"], f"{r['median_step_s'] * 1e3:.0f} ms", f"{r['bytes_per_step'] / 1e6:.3f}",
                  f"{r['speedup_vs_dense']:.2f}x", f"{r['speedup_vs_fp16']:.2f}x",
                  "– (no communication)" if r["config"] == "compute only" else r["params_identical"]]
                 for r in results])


def synthetic(repeats, rate=None, framework="torch", cycle_ms=None):
    """<framework>/synthetic_benchmark.py (ResNet-50, random images, 2 ranks) with Horovod's
    dense fp32 and fp16 and the default DeepReduce(): on unthrottled loopback, or with `rate`
    (as root) in a namespace shaped to it, beside (torch) DDP PowerSGD rank 4 and the
    compute-only step. `repeats` rounds, each running every configuration in turn, every other
    round in reverse order (this machine drifts within a round: a fixed order charges the
    drift to whichever configuration runs last), ours next to dense (the ratio that matters
    taken between adjacent jobs); each row holds the median run's details and
    the median of its rounds' img/s, "runs" every round's in round order. cycle_ms: Horovod's
    cycle time for every configuration (its default: 1 ms; README, "Horovod's cycle time")."""
    configs = ["dense fp32", "DeepReduce default", "fp16"]
    if rate:
        configs += ["DDP PowerSGD r4", "compute only"] if framework == "torch" else []
        shaped_namespace(rate)
    runs = {config: [] for config in configs}
    try:
        for round_ in range(repeats):
            for config in configs if round_ % 2 == 0 else reversed(configs):
                runs[config].append(saved_run(f"{framework}/synthetic_benchmark.py", 2,
                                              CONFIGS[config], 1800, netns=bool(rate),
                                              cycle_ms=cycle_ms))
                run = runs[config][-1]
                print(f"round {round_ + 1}, {config}: {run['img_per_s_total']:.2f} img/s",
                      guard_verdict(run.get("guard")), flush=True)
    finally:
        if rate:
            remove_namespace()
    rows = []
    for config in configs:
        rates = [r["img_per_s_total"] for r in runs[config]]
        middle = sorted(runs[config], key=lambda r: r["img_per_s_total"])[len(rates) // 2]
        rows.append({"config": config, **middle, "img_per_s_total": statistics.median(rates),
                     "runs": rates})
    parts = ["synthetic", framework if framework != "torch" else None, rate,
             f"cycle{cycle_ms:g}ms" if cycle_ms else None]
    stem = "_".join(part for part in parts if part)
    (DOCS / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    synthetic_table(stem, rows)


def guard_verdict(guard):
    """The step guard's winner and the step times it compared (median, fastest-slowest), in a
    table cell."""
    def steps(g, arm):
        median, fastest, slowest = (g.get(field, {}).get(arm) for field in
                                    ("compared_ms", "fastest_ms", "slowest_ms"))
        spread = f" ({fastest / 1e3:.2f}-{slowest / 1e3:.2f})" if fastest and slowest else ""
        return f"{median / 1e3:.2f} s" + spread
    return "; ".join(f"{name}: {g['winner']} (" + ", ".join(f"{arm} {steps(g, arm)}" for arm in
                                                            g["compared_ms"]) +
                     (f"; the plan's dense tensors by {g['dense']}" if g.get("dense") else "") + ")"
                     for name, g in (guard or {}).items())


def synthetic_table(stem, rows):
    """docs/<stem>.md from the synthetic benchmark's rows."""
    dense = rows[0]["img_per_s_total"]
    floor = rows[-1]["img_per_s_total"] if rows[-1]["config"] == "compute only" else None
    write_table(stem, ["configuration", "img/s (2 ranks)", "vs dense fp32", "vs compute only",
                       "runs", "planner's choices", "step guard"], "lrrrlll",
                [[r["config"], f"{r['img_per_s_total']:.2f}", f"{r['img_per_s_total'] / dense:.0%}",
                  f"{r['img_per_s_total'] / floor:.0%}" if floor else "–",
                  ", ".join(f"{x:.2f}" for x in r["runs"]), r.get("choices", ""),
                  guard_verdict(r.get("guard"))] for r in rows])


def ratio_rows(results):
    """Each result with its speed-up over dense fp32 and fp16, and the compute-only floor."""
    base = {(r["link"], r["workload"], r["config"]): r for r in results}
    for r in results:
        key = (r["link"], r["workload"])
        for name, column in (("dense fp32", "speedup_vs_dense"), ("fp16", "speedup_vs_fp16")):
            other = base.get((*key, name))
            r[column] = other["median_step_s"] / r["median_step_s"] if other else None
        floor = base.get((*key, "compute only"))
        r["floor_s"] = floor["median_step_s"] if floor else None
    return results


def report_network(results, quick):
    results = ratio_rows(results)
    DOCS.mkdir(exist_ok=True)
    (DOCS / "e2e.json").write_text(json.dumps({"quick": quick, "results": results}, indent=1))
    fmt = lambda x: "–" if x is None else f"{x:.2f}x"  # noqa: E731
    ms = lambda x: "–" if x is None else f"{x * 1e3:.0f} ms"  # noqa: E731
    write_table("e2e", ["link", "workload", "configuration", "median step", "MB sent/step/rank",
                        "vs dense fp32", "vs fp16", "compute-only floor"], "lllrrrrr",
                [[r["link"], r["workload"], r["config"], f"{r['median_step_s'] * 1e3:.0f} ms",
                  f"{r['bytes_per_step'] / 1e6:.3f}", fmt(r["speedup_vs_dense"]),
                  fmt(r["speedup_vs_fp16"]), ms(r["floor_s"])] for r in results])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    links = list(dict.fromkeys(r["link"] for r in results))
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    fig, axes = plt.subplots(len(links), len(workloads), squeeze=False,
                             figsize=(4.5 * len(workloads), 3.2 * len(links)))
    for ax, (link, workload) in zip(axes.ravel(), [(l, w) for l in links for w in workloads]):
        rows = [r for r in results if r["workload"] == workload and r["link"] == link]
        ax.barh([r["config"] for r in rows], [1e3 * r["median_step_s"] for r in rows])
        ax.set_title(f"{workload}, {link}")
        floor = next((r["floor_s"] for r in rows if r["floor_s"]), None)
        if floor:
            ax.axvline(1e3 * floor, color="black", linestyle=":", label="compute only")
        ax.set_xscale("log")
        ax.set_xlabel("median step time (ms, log)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(DOCS / "e2e_step_time.png", dpi=110)


def convergence(quick):
    configs = ["dense fp32", "top-k raw pairs", "entropy+qsgd"] if quick else list(CONFIGS)
    epochs_cnn, epochs_lm = (4, 2) if quick else (8, 3)
    curves = {"digits CNN": {}, "LSTM LM": {}}
    for config in configs:
        curves["digits CNN"][config] = saved_run(
            "torch/train_digits.py", 2, ["--no-progress", "--epochs", epochs_cnn, *CONFIGS[config]],
            1800, netns=False)["history"]
        if not quick:
            curves["LSTM LM"][config] = saved_run(
                "torch/train_lm.py", 2, ["--epochs", epochs_lm, "--steps-per-epoch", 30,
                                         *CONFIGS[config]], 1800, netns=False)["history"]
        print(f"{config}: done", flush=True)
    DOCS.mkdir(exist_ok=True)
    (DOCS / "convergence.json").write_text(json.dumps({"quick": quick, "curves": curves}, indent=1))
    report_convergence(curves, configs)


def report_convergence(curves, configs):
    cnn, lm = curves["digits CNN"], curves["LSTM LM"]
    rows = []
    for config in configs:
        acc = cnn[config][-1]["test_accuracy"]
        d_acc = acc - cnn["dense fp32"][-1]["test_accuracy"]
        ppl = lm[config][-1]["val_perplexity"] if config in lm else None
        d_ppl = ppl / lm["dense fp32"][-1]["val_perplexity"] - 1 if ppl else None
        rows.append([config, f"{acc:.4f}", f"{d_acc:+.4f}", "–" if ppl is None else f"{ppl:.1f}",
                     "–" if d_ppl is None else f"{100 * d_ppl:+.1f}%",
                     f"{cnn[config][-1]['mb_sent']:.1f}"])
    write_table("convergence", ["configuration", "digits test accuracy", "vs dense",
                                "LSTM val. perplexity", "vs dense", "MB sent (digits)"], "lrrrrr", rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for config, history in cnn.items():
        axes[0].plot([h["epoch"] for h in history], [h["test_accuracy"] for h in history],
                     marker="o", label=config)
    for config, history in lm.items():
        axes[1].plot([h["epoch"] for h in history], [h["val_perplexity"] for h in history],
                     marker="o", label=config)
    axes[0].set(title="digits CNN", xlabel="epoch", ylabel="test accuracy")
    axes[1].set(title="LSTM LM (Python stdlib)", xlabel="epoch", ylabel="validation perplexity")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "convergence.png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["network", "convergence", "hosts", "synthetic",
                                         "network-report",
                                         "convergence-report"],
                        help="*-report: redraw the markdown and PNG from the saved JSON")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (network)")
    parser.add_argument("--rate", help="synthetic: shape the link to this rate (as root), e.g. 1gbit")
    parser.add_argument("--framework", choices=["torch", "tf"], default="torch", help="synthetic")
    parser.add_argument("--cycle-ms", type=float,
                        help="synthetic: Horovod's cycle time (ms) for every configuration")
    args = parser.parse_args()
    if args.what == "network-report":
        saved = json.loads((DOCS / "e2e.json").read_text())
        report_network(saved["results"], saved["quick"])
    elif args.what == "convergence-report":
        curves = json.loads((DOCS / "convergence.json").read_text())["curves"]
        report_convergence(curves, list(curves["digits CNN"]))
    elif args.what == "network":
        network(args.quick, args.repeats)
    elif args.what == "hosts":
        hosts(args.repeats)
    elif args.what == "synthetic":
        synthetic(args.repeats, args.rate, args.framework, args.cycle_ms)
    else:
        convergence(args.quick)


if __name__ == "__main__":
    main()
