#!/usr/bin/env python3
"""Writes tests/data/gptq/: small GPTQ checkpoints and their dequantized weights (numpy only).

Written from the GPTQ format definition (AutoGPTQ / GPTQModel checkpoints as read by
transformers and vLLM), not from Gyre's code:
  qweight int32 [in * bits / 32, out]: input row i of column o sits at bits (i % k) * bits of
          word [i // k, o], k = 32 // bits, lowest bits first (2, 4, 8 bits). 3 bits: 32 inputs
          per 3 words; with U = word[3u] + word[3u+1] * 2^32 + word[3u+2] * 2^64 (a 96-bit
          integer), input 32u + j sits at bits 3j .. 3j+2 of U (so inputs 10 and 21 straddle).
  qzeros  int32 [groups, out * bits / 32]: zero of (group g, column o) at bits (o % k) * bits of
          word [g, o // k]; 3 bits: the same 32-per-3-words units along the outputs.
  scales  float16 [groups, out];  g_idx int32 [in]: group of each input column.
  checkpoint_format "gptq" (v1) stores zero - 1, "gptq_v2" stores the zero itself.
  W[o, i] = scales[g, o] * (q[i, o] - zero[g, o]), g = g_idx[i], computed in float32.

Output (each file a standard safetensors file):
  layers/<case>.safetensors: layer.qweight, layer.qzeros, layer.scales, [layer.g_idx],
      expected (float32 [out, in], the spec formula); cases.json lists each case's
      quantization_config.
  llama/: a tiny Llama (2 layers, hidden 64) whose projections are GPTQ 4-bit, asymmetric,
      group 32, desc_act, v1 zeros; llama_float/: the same model with the spec-dequantized
      float32 weights and no quantization_config. llama3/, llama3_float/: the same at 3 bits. tokenizer.json is stories260K's.
Usage: tools/make_gptq_fixture.py [fixtures dir] [output dir]
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared", "fixtures")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "tests", "data", "gptq")


def write_safetensors(path, tensors):
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def pack3(v):
    """3-bit values v [n, m] (n a multiple of 32) -> uint32 [n * 3 // 32, m]: each unit of 32
    values along axis 0 becomes one 96-bit integer U (value j at bits 3j), stored as 3 words,
    lowest first. Python integers, so nothing is truncated on the way."""
    n, m = v.shape
    out = np.zeros((n // 32 * 3, m), dtype=np.uint32)
    for u in range(n // 32):
        for c in range(m):
            unit = 0
            for j in range(32):
                unit |= int(v[32 * u + j, c]) << (3 * j)
            for w in range(3):
                out[3 * u + w, c] = (unit >> (32 * w)) & 0xFFFFFFFF
    return out


def make_layer(rng, in_f, out_f, bits, group_size, desc_act, sym, v2, weight_std=None):
    """Random quantized layer: returns (tensors dict without prefix, expected float32 [out, in])."""
    k = 32 // bits
    gs = in_f if group_size == -1 else group_size
    groups = in_f // gs
    # g_idx: each group has gs columns; with desc_act the columns of a group are scattered.
    order = rng.permutation(in_f) if desc_act else np.arange(in_f)
    g_idx = np.empty(in_f, dtype=np.int32)
    g_idx[order] = np.arange(in_f) // gs
    q = rng.integers(0, 1 << bits, size=(in_f, out_f), dtype=np.int64)
    if sym:
        zero = np.full((groups, out_f), 1 << (bits - 1), dtype=np.int64)
    elif v2:
        zero = rng.integers(0, 1 << bits, size=(groups, out_f), dtype=np.int64)
    else:  # v1 stores zero - 1 in `bits` bits: zeros 1 .. 2^bits
        zero = rng.integers(1, (1 << bits) + 1, size=(groups, out_f), dtype=np.int64)
    stored_zero = zero if v2 else zero - 1
    step = (weight_std or 0.05) * 2.0 / (1 << bits)
    scales = (rng.uniform(0.5, 1.5, size=(groups, out_f)) * step).astype(np.float16)

    if bits == 3:
        qweight = pack3(q)                    # along the inputs (axis 0)
        qzeros = pack3(stored_zero.T).T.copy()  # along the outputs
    else:
        qweight = np.zeros((in_f // k, out_f), dtype=np.uint32)
        for i in range(in_f):
            qweight[i // k] |= (q[i].astype(np.uint32) << np.uint32((i % k) * bits))
        qzeros = np.zeros((groups, out_f // k), dtype=np.uint32)
        for o in range(out_f):
            qzeros[:, o // k] |= (stored_zero[:, o].astype(np.uint32) << np.uint32((o % k) * bits))

    s = scales.astype(np.float32)[g_idx]                      # [in, out]
    diff = (q - zero[g_idx]).astype(np.float32)               # exact small integers
    expected = (s * diff).astype(np.float32).T.copy()        # [out, in]
    tensors = {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32),
               "scales": scales, "g_idx": g_idx}
    return tensors, expected


LAYER_CASES = [
    # name, in, out, bits, group_size, desc_act, sym, v2, with g_idx
    ("s4_g32_v1", 64, 32, 4, 32, False, True, False, True),
    ("a4_g32_v1_noidx", 64, 16, 4, 32, False, False, False, False),
    ("a4_g128_act_v2", 256, 16, 4, 128, True, False, True, True),
    ("s4_g64_act_v2", 128, 8, 4, 64, True, True, True, True),
    ("a4_gm1_v1", 96, 8, 4, -1, False, False, False, True),
    ("s8_gm1_v1", 96, 8, 8, -1, False, True, False, True),
    ("a8_g32_act_v1", 64, 16, 8, 32, True, False, False, True),
    ("s8_g128_v2", 256, 8, 8, 128, False, True, True, True),
    ("a8_g512_v2", 512, 4, 8, 512, False, False, True, True),
]


# Written with their own random stream (after the cases above and the llama), so adding them left
# every earlier file unchanged. 3-bit layers need out to be a multiple of 32 (qzeros units).
EXTRA_CASES = [
    ("s3_g32_v1", 64, 32, 3, 32, False, True, False, True),
    ("a3_g128_act_v2", 256, 32, 3, 128, True, False, True, True),
    ("a3_g32_act_v1", 128, 64, 3, 32, True, False, False, True),
    ("s3_gm1_v2", 96, 32, 3, -1, False, True, True, True),
    ("a3_gm1_v1_noidx", 160, 32, 3, -1, False, False, False, False),
    ("s3_g128_v1_noidx", 128, 96, 3, 128, False, True, False, False),
    ("a2_g64_act_v1", 128, 16, 2, 64, True, False, False, True),
]


def quant_config(bits, group_size, desc_act, sym, v2):
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act,
            "sym": sym, "checkpoint_format": "gptq_v2" if v2 else "gptq"}


def write_layers(rng, case_table, cases):
    os.makedirs(os.path.join(OUT, "layers"), exist_ok=True)
    for name, in_f, out_f, bits, gs, act, sym, v2, with_idx in case_table:
        t, expected = make_layer(rng, in_f, out_f, bits, gs, act, sym, v2)
        if not with_idx:
            del t["g_idx"]
        tensors = {"layer." + k: v for k, v in t.items()}
        tensors["expected"] = expected
        write_safetensors(os.path.join(OUT, "layers", name + ".safetensors"), tensors)
        cases.append({"name": name, "in": in_f, "out": out_f,
                      "quantization_config": quant_config(bits, gs, act, sym, v2)})


def write_llama(rng, bits=4, names=("llama", "llama_float")):
    hidden, inter, layers, heads, kv_heads, vocab = 64, 128, 2, 4, 2, 512
    head_dim = hidden // heads
    qc = quant_config(bits, 32, True, False, False)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": vocab, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float16",
    }
    quant, dense = {}, {}
    embed = (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float16)
    quant["model.embed_tokens.weight"] = dense["model.embed_tokens.weight"] = embed
    norm = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    quant["model.norm.weight"] = dense["model.norm.weight"] = norm
    shapes = {"self_attn.q_proj": (hidden, heads * head_dim),
              "self_attn.k_proj": (hidden, kv_heads * head_dim),
              "self_attn.v_proj": (hidden, kv_heads * head_dim),
              "self_attn.o_proj": (heads * head_dim, hidden),
              "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter),
              "mlp.down_proj": (inter, hidden)}
    for layer in range(layers):
        for n in ("input_layernorm", "post_attention_layernorm"):
            w = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
            quant[f"model.layers.{layer}.{n}.weight"] = dense[f"model.layers.{layer}.{n}.weight"] = w
        for n, (in_f, out_f) in shapes.items():
            p = f"model.layers.{layer}.{n}"
            t, expected = make_layer(rng, in_f, out_f, bits, 32, True, False, False,
                                     weight_std=1.5 / np.sqrt(in_f))
            for k, v in t.items():
                quant[p + "." + k] = v
            dense[p + ".weight"] = expected
    tok = os.path.join(FIXTURES, "stories260K", "tokenizer.json")
    for sub, tensors, cfg in ((names[0], quant, dict(config, quantization_config=qc)),
                              (names[1], dense, config)):
        d = os.path.join(OUT, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        shutil.copyfile(tok, os.path.join(d, "tokenizer.json"))


def main():
    rng = np.random.default_rng(20261122)
    cases = []
    write_layers(rng, LAYER_CASES, cases)
    write_llama(rng)
    extra = np.random.default_rng(20261123)
    write_layers(extra, EXTRA_CASES, cases)
    write_llama(extra, 3, ("llama3", "llama3_float"))
    with open(os.path.join(OUT, "layers", "cases.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
