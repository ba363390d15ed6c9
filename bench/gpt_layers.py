# SPDX-License-Identifier: Apache-2.0
"""bench/gpt_layers.py: the example trainer's model (examples/gpt: llm.c's GPT-2, pre-LayerNorm
blocks of causal attention and a tanh-GELU MLP, the head tied to wte, cross-entropy) written
plainly in PyTorch, one forward and backward timed, as bench/gpt_layers.c times zinf_gpt's CPU
layers: the same shapes, fp32, the threads of OMP_NUM_THREADS (torch.set_num_threads too).
Attention as nanoGPT writes it without flash attention (q k^T, the causal mask, softmax, @ v).

--arch llama: the trainer's Llama, a plain nn.Module written out with LlamaForCausalLM's math
(transformers' eager path, not transformers itself: the Debian python3-torch that links the
system's libblas.so.3 has no transformers beside it): RMSNorm (eps 1e-5), rotary embeddings
(rotate_half, cos and sin computed in each forward from inv_freq as LlamaRotaryEmbedding does),
grouped-query attention (repeat_kv, then q k^T / sqrt(hs), the causal mask, softmax, @ v), the
SwiGLU MLP (down(silu(gate(x)) * up(x))), no biases, the head untied (lm_head); --kv-heads,
--ffn (default the heads and 4C) and --rope-theta (default 10000).

    python3 bench/gpt_layers.py [--arch gpt2|llama] [--layers L] [--heads H] [--hidden C]
                                [--context T] [--vocab V] [--batch B] [--kv-heads KVH]
                                [--ffn FF] [--rope-theta THETA] [--reps R] [--warmup W]
                                [--c-lib SO]

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


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x * r)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, KVH, FF):
        super().__init__()
        self.NH, self.KVH, self.hs = NH, KVH, C // NH
        self.attn_norm = RMSNorm(C)
        self.q = nn.Linear(C, C, bias=False)
        self.k = nn.Linear(C, KVH * self.hs, bias=False)
        self.v = nn.Linear(C, KVH * self.hs, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.mlp_norm = RMSNorm(C)
        self.gate = nn.Linear(C, FF, bias=False)
        self.up = nn.Linear(C, FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)

    def attention(self, x, cos, sin, mask):
        B, T, C = x.shape
        hs, rep = self.hs, self.NH // self.KVH
        q = self.q(x).view(B, T, self.NH, hs).transpose(1, 2)
        k = self.k(x).view(B, T, self.KVH, hs).transpose(1, 2)
        v = self.v(x).view(B, T, self.KVH, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # transformers' repeat_kv: each key-value head for its rep query heads
        k = k[:, :, None].expand(B, self.KVH, rep, T, hs).reshape(B, self.NH, T, hs)
        v = v[:, :, None].expand(B, self.KVH, rep, T, hs).reshape(B, self.NH, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.o((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attn_norm(x), cos, sin, mask)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, V, T, C, NH, L, KVH, FF, theta):
        super().__init__()
        hs = C // NH
        self.embed = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, NH, KVH, FF) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hs, 2).float() / hs))
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))
        for p in self.parameters():  # N(0, 0.02), the norms' weights 1
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.embed(tokens)
        freqs = torch.arange(T, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = self.mask[:T, :T]
        for b in self.blocks:
            x = b(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
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
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--ffn", type=int, default=0)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--c-lib")
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    llama = a.arch == "llama"
    kvh, ffn = a.kv_heads or a.heads, a.ffn or 4 * a.hidden
    if llama:
        model = Llama(a.vocab, a.context, a.hidden, a.heads, a.layers, kvh, ffn, a.rope_theta)
    else:
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
        c.gpt_layers_bench_open_arch.restype = ctypes.c_void_p
        c.gpt_layers_bench_open_arch.argtypes = [ctypes.c_int] * 9 + [ctypes.c_double]
        bench = c.gpt_layers_bench_open_arch(int(llama), a.layers, a.heads, a.hidden, a.context,
                                             a.vocab, a.batch, kvh if llama else 0,
                                             ffn if llama else 0,
                                             a.rope_theta if llama else 0.0)
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
        "threads": torch.get_num_threads(), "arch": a.arch, "layers": a.layers,
        "heads": a.heads, "kv_heads": kvh if llama else a.heads,
        "ffn": ffn if llama else 4 * a.hidden,
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
