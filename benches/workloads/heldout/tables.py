"""Prints the held-out evaluation's Markdown tables (benches/README.md) from eval.sh's JSON.

Usage: python3 benches/workloads/heldout/tables.py benches/results
"""
import json
import sys
from pathlib import Path


def recall_table(inside, outside):
    k = inside["top_k"]
    print(f"| head | in domain recall@{k} | persistence | router | out of domain recall@{k} | persistence | router |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for a, b in zip(inside["layers"], outside["layers"]):
        row = [f"{a['layer']} → {a['target_layer']}"]
        for l in (a, b):
            row += [f"{l['head']['recall']:.3f}", f"{l['persistence']['recall']:.3f}", f"{l['router']['recall']:.3f}"]
        print("| " + " | ".join(row) + " |")
    row = ["**mean**"]
    for r in (inside, outside):
        row += [f"**{r['mean_recall']:.3f}**", f"{r['mean_persistence_recall']:.3f}", f"{r['mean_router_recall']:.3f}"]
    print("| " + " | ".join(row) + " |")
    print(f"\ntokens: in domain {inside['tokens']}, out of domain {outside['tokens']}; "
          f"recall@{2 * k} of the heads {inside['mean_recall_2k']:.3f} / {outside['mean_recall_2k']:.3f}")


def cache_table(results, total, cell):
    slots = sorted({r["slots"] for r in results})
    rows = {}
    for r in results:
        name = r["policy"] if r["prefetch"] == "none" else f"{r['policy']} + {r['prefetch']} prefetch"
        rows.setdefault(name, {})[r["slots"]] = r
    print("| policy | " + " | ".join(f"{s} slots ({100 * s / total:.0f}%)" for s in slots) + " |")
    print("| --- |" + " ---: |" * len(slots))
    for name, by_slots in rows.items():
        cells = ["-" if by_slots.get(s) is None else cell(by_slots[s]) for s in slots]
        print(f"| {name} | " + " | ".join(cells) + " |")


def hit_rate(r):
    ratio = "" if r["vs_belady"] is None else f" ({r['vs_belady']:.3f}×)"
    return f"{100 * r['hit_rate']:.1f}%{ratio}"


def mib_read(r):
    return f"{r['bytes_read'] / 2**20:.0f}"


def main():
    out = Path(sys.argv[1])
    load = lambda name: json.loads((out / name).read_text())
    recall_table(load("heldout-prerouter-in-domain.json"), load("heldout-prerouter-out-of-domain.json"))
    print()
    names = ["heldout-cache.json", "heldout-cache-prefetch.json", "heldout-cache-prerouter.json",
             "heldout-cache-prerouter-eamc.json"]
    results = [r for name in names if (out / name).exists() for r in load(name)["results"]]
    belady = {r["slots"]: r for r in results if r["policy"] == "belady"}
    for r in results:
        if r["vs_belady"] is None and r["slots"] in belady:
            r["vs_belady"] = r["hit_rate"] / belady[r["slots"]]["hit_rate"]
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    cache_table(results, total, hit_rate)
    print("\nMiB read from the store:\n")
    cache_table([r for r in results if r["policy"] != "belady"], total, mib_read)


if __name__ == "__main__":
    main()
