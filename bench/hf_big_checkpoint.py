# SPDX-License-Identifier: Apache-2.0
"""Write a large Hugging Face Llama checkpoint of random weights, for bench/hf_import_big.sh.

    python3 bench/hf_big_checkpoint.py OUT_DIR [--layers 24] [--hidden 2048] [--vocab 8000]

config.json as transformers writes a LlamaConfig, and the weights as f32 safetensors shards of at
most 2 GB with model.safetensors.index.json (as save_pretrained cuts them), written one shard at a
time so that this script holds at most one shard in memory. The defaults make 1.09e9 parameters,
4.35 GB: TinyLlama's block (hidden 2048, 32 heads over 4 key-value heads, MLP 5632) with a small
vocabulary, so that the embedding (the largest tensor, which sizes the engine's buffers) stays
small. Needs numpy and safetensors (PyPI); zinf itself never runs it.
"""
import argparse
import json
import os

import numpy as np
from safetensors.numpy import save_file

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--layers", type=int, default=24)
p.add_argument("--hidden", type=int, default=2048)
p.add_argument("--heads", type=int, default=32)
p.add_argument("--kv-heads", type=int, default=4)
p.add_argument("--ffn", type=int, default=5632)
p.add_argument("--vocab", type=int, default=8000)
p.add_argument("--shard-bytes", type=int, default=2 * 10**9)
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
H, hs = a.hidden, a.hidden // a.heads
kvd = a.kv_heads * hs
shapes = [("model.embed_tokens.weight", (a.vocab, H))]
for l in range(a.layers):
    pre = "model.layers.%d." % l
    shapes += [
        (pre + "input_layernorm.weight", (H,)),
        (pre + "self_attn.q_proj.weight", (H, H)),
        (pre + "self_attn.k_proj.weight", (kvd, H)),
        (pre + "self_attn.v_proj.weight", (kvd, H)),
        (pre + "self_attn.o_proj.weight", (H, H)),
        (pre + "post_attention_layernorm.weight", (H,)),
        (pre + "mlp.gate_proj.weight", (a.ffn, H)),
        (pre + "mlp.up_proj.weight", (a.ffn, H)),
        (pre + "mlp.down_proj.weight", (H, a.ffn)),
    ]
shapes += [("model.norm.weight", (H,)), ("lm_head.weight", (a.vocab, H))]
shards, cur, size = [], [], 0
for name, shape in shapes:
    b = 4 * int(np.prod(shape))
    if cur and size + b > a.shard_bytes:
        shards.append(cur)
        cur, size = [], 0
    cur.append((name, shape))
    size += b
shards.append(cur)
rng = np.random.default_rng(1)
weight_map, total = {}, 0
for k, shard in enumerate(shards):
    fname = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
    tensors = {}
    for name, shape in shard:
        if len(shape) == 1:
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        weight_map[name] = fname
        total += tensors[name].nbytes
    save_file(tensors, os.path.join(a.out, fname), metadata={"format": "pt"})
    del tensors
with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": a.vocab,
    "hidden_size": H, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
    "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32",
}
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
n = sum(int(np.prod(s)) for _, s in shapes)
print("%s: %d parameters, %.2f GB in %d shards" % (a.out, n, total / 1e9, len(shards)))
