# SPDX-License-Identifier: Apache-2.0
"""bench/gpt_layers.py: the example trainer's model (examples/gpt: llm.c's GPT-2, pre-LayerNorm
blocks of causal attention and a tanh-GELU MLP, the head tied to wte, cross-entropy) written
plainly in PyTorch, one forward and backward timed, as bench/gpt_layers.c times zinf_gpt's CPU
layers: the same shapes, fp32, the threads of OMP_NUM_THREADS (torch.set_num_threads too).
Attention as nanoGPT writes it without flash attention (q k^T, the causal mask, softmax, @ v).

    python3 bench/gpt_layers.py [--layers L] [--heads H] [--hidden C] [--context T]
                                [--vocab V] [--batch B] [--reps R] [--warmup W]

Prints one JSON line like bench_gpt_layers': the median and every rep's seconds, and the BLAS
and OpenMP libraries the process has mapped (from /proc/self/maps), so that a run says which
BLAS PyTorch's products went through (bench/gpt_layers.sh points libblas.so.3 at the same
OpenBLAS as the C layers').
"""
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
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = GPT(a.vocab, a.context, a.hidden, a.heads, a.layers)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    targets = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    times = []
    for _ in range(a.warmup + a.reps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        times.append(time.perf_counter() - t0)
    times = times[a.warmup:]
    print(json.dumps({
        "bench": "gpt_layers", "impl": "pytorch", "torch": torch.__version__,
        "threads": torch.get_num_threads(), "layers": a.layers, "heads": a.heads,
        "hidden": a.hidden, "context": a.context, "vocab": a.vocab, "batch": a.batch,
        "params": sum(p.numel() for p in model.parameters()), "loss": round(loss.item(), 6),
        "reps": a.reps, "median_s": round(statistics.median(times), 6),
        "libraries": mapped_libraries(), "all_s": [round(t, 6) for t in times]}))


if __name__ == "__main__":
    main()
