#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""examples/gpt/plot.py: zinf_gpt's --json records (JSON lines) as a PNG: the loss against
the data's entropy floor, and the NVMe read and write bandwidth, over steps.

    python3 examples/gpt/plot.py run.jsonl [more.jsonl ...] -o run.png

An optional tool (matplotlib); nothing builds or tests with it.
"""
import argparse
import json
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="zinf_gpt --json files")
    ap.add_argument("-o", "--output", default="zinf_gpt.png")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py needs matplotlib (pip install matplotlib)")
    fig, (ax_loss, ax_bw) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for path in args.records:
        recs = read(path)
        steps = [r["step"] for r in recs]
        ax_loss.plot(steps, [r["loss"] for r in recs], label=f"loss ({path})")
        ax_bw.plot(steps, [r["nvme_read_GBps"] for r in recs], label=f"read ({path})")
        ax_bw.plot(steps, [r["nvme_write_GBps"] for r in recs], label=f"write ({path})")
    floor = read(args.records[0])[0]["floor"]
    ax_loss.axhline(floor, color="k", linestyle="--", label=f"entropy floor {floor:.4f}")
    ax_loss.set_ylabel("cross-entropy (nats)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_bw.set_ylabel("NVMe GB/s (10^9 B/s)")
    ax_bw.set_xlabel("optimizer step")
    ax_bw.legend()
    ax_bw.grid(alpha=0.3)
    fig.suptitle("zinf_gpt")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
