# SPDX-License-Identifier: Apache-2.0
"""bench/gpt_layers.py: the example trainer's model (examples/gpt: llm.c's GPT-2, pre-LayerNorm
blocks of causal attention and a tanh-GELU MLP, the head tied to wte, cross-entropy) written
plainly in PyTorch, one forward and backward timed, as bench/gpt_layers.c times zinf_gpt's CPU
layers: the same shapes, fp32, the threads of OMP_NUM_THREADS (torch.set_num_threads too).
Attention as nanoGPT writes it without flash attention (q k^T, the causal mask, softmax, @ v).

    python3 bench/gpt_layers.py [--layers L] [--heads H] [--hidden C] [--context T]
                                [--vocab V] [--batch B] [--reps R] [--warmup W] [--c-lib SO]

Prints one JSON line like bench_gpt_layers': the median and every rep's seconds, and the BLAS
and OpenMP libraries the process has mapped (from /proc/self/maps), so that a run says which
BLAS PyTorch's products went through (bench/gpt_layers.sh points libblas.so.3 at the same
OpenBLAS as the C layers').

--c-lib BUILD/libgpt_layers_bench.so: the C layers too, in this process (bench/gpt_layers.c built
as a library), one C step and one PyTorch step alternately (C first on even reps, PyTorch first
on odd ones); the line has both sides' medians and every pair's ratio pytorch / c, whose median
is the C layers' speed as a fraction of PyTorch's. One process: one libgomp, one OpenBLAS, and a
load that changes from second to second hits both sides of a pair alike.
"""
import ctypes
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.attproj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, NH, L):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, T) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's: N(0, 0.02), LayerNorm 1, biases 0
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif ".ln" in name or name.startswith("ln"):
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # the head tied to wte
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def mapped_libraries():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            if any(s in base for s in ("blas", "lapack", "gomp", "mkl", "dnnl")):
                libs.add(path)
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 4), ("heads", 4), ("hidden", 64), ("context", 32),
                          ("vocab", 64), ("batch", 16), ("reps", 10), ("warmup", 2)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--c-lib")
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = GPT(a.vocab, a.context, a.hidden, a.heads, a.layers)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    targets = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    c = None
    if a.c_lib:
        c = ctypes.CDLL(a.c_lib)
        c.gpt_layers_bench_open.restype = ctypes.c_void_p
        c.gpt_layers_bench_step.restype = ctypes.c_double
        c.gpt_layers_bench_step.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        c.gpt_layers_bench_close.argtypes = [ctypes.c_void_p]
        for f in ("products", "blas", "core"):
            getattr(c, "gpt_layers_bench_" + f).restype = ctypes.c_char_p
        bench = c.gpt_layers_bench_open(a.layers, a.heads, a.hidden, a.context, a.vocab,
                                        a.batch)
        if not bench:
            raise SystemExit("gpt_layers.py: the C layers: out of memory")

    def torch_step():
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        return time.perf_counter() - t0, loss.item()

    times, ctimes = [], []
    for r in range(a.warmup + a.reps):
        if c and r % 2 == 0:
            ctimes.append(c.gpt_layers_bench_step(bench, None))
        t, loss = torch_step()
        times.append(t)
        if c and r % 2 == 1:
            ctimes.append(c.gpt_layers_bench_step(bench, None))
    times, ctimes = times[a.warmup:], ctimes[a.warmup:]
    out = {
        "bench": "gpt_layers", "impl": "pytorch", "torch": torch.__version__,
        "threads": torch.get_num_threads(), "layers": a.layers, "heads": a.heads,
        "hidden": a.hidden, "context": a.context, "vocab": a.vocab, "batch": a.batch,
        "params": sum(p.numel() for p in model.parameters()), "loss": round(loss, 6),
        "reps": a.reps, "median_s": round(statistics.median(times), 6),
        "libraries": mapped_libraries(), "all_s": [round(t, 6) for t in times]}
    if c:
        ratios = [p / q for p, q in zip(times, ctimes)]
        out.update({
            "impl": "both", "products": c.gpt_layers_bench_products().decode(),
            "blas": c.gpt_layers_bench_blas().decode(),
            "core": c.gpt_layers_bench_core().decode(),
            "c_median_s": round(statistics.median(ctimes), 6),
            "c_all_s": [round(t, 6) for t in ctimes],
            "ratio_median": round(statistics.median(ratios), 4),
            "ratios": [round(x, 4) for x in ratios]})
        c.gpt_layers_bench_close(bench)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
