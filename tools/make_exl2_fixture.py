#!/usr/bin/env python3
"""Writes tests/data/exl2/: small ExLlamaV2 (EXL2) layers and a tiny EXL2 Llama (numpy only).

Written from the EXL2 format as ExLlamaV2's converter writes it and its loader reads it (facts
only, no code taken). Per linear layer P with in_features K (rows) and out_features N:
  P.q_invperm  int32 [K]        the act-order permutation: input row i is quantized row
                                invperm[i] (P.q_perm, when present, is its inverse)
  P.q_groups   int16 [2 * G]    per group g: (bits_g, first packed row of g in q_weight); the
                                groups cover the quantized rows in order, bits non-increasing
                                (8, 6, 5, 4, 3, 2) as ExLlamaV2's kernels expect
  P.q_weight   int32 [R, Np]    Np = N rounded up to 32 (padding columns). Group g's rows
                                form, per column, one little-endian bit stream of bits_g-bit
                                codes starting at bit 0 of packed row first_g (row j of the
                                group at stream bit j * bits_g; codes may straddle words)
  P.q_scale    int32 [G, Np/8]  4-bit scale codes, column n at bits 4*(n % 8) of word n // 8
  P.q_scale_max float16 [G]
  P.bias       optional
A group's row count is (next first - first) * 32 / bits, the last group takes the rest of K.
Dequantized as ExLlamaV2 reconstructs it, all in fp16 with round-to-nearest-even:
  m = fp16(q_scale_max / 256)            (the loader's prescale; exact unless subnormal)
  s = fp16((code + 1)^2 * m)
  W[n, i] = fp16((q - 2^(bits-1)) * s)   q the code of quantized row invperm[i], column n

Output (standard safetensors files):
  layers/<case>.safetensors: layer.* tensors and `expected` (float32 [N, K]) from the numpy
      dequantization below (it unpacks with np.unpackbits, independently of the packer);
      cases.json lists each case's out_features and bit layout.
  llama/: stories260K's first 2 layers with every projection and the head (its own bit mix)
      in EXL2 with random act-order; llama_float/: the same model with the numpy-dequantized
      weights as float16 and no quantization_config. tokenizer.json is stories260K's.
Usage: tools/make_exl2_fixture.py [fixtures dir] [output dir]
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared", "fixtures")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "tests", "data", "exl2")

ST_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
            np.dtype(np.int32): "I32", np.dtype(np.int16): "I16"}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": ST_NAMES[arr.dtype], "shape": list(arr.shape),
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


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    types = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=types[info["dtype"]]).reshape(info["shape"])
    return out


# ---- Packing (the writer side): integer shifts into 32-bit words ----

def pack_group(codes, bits):
    """codes [rows, Np] -> int words [ceil(rows*bits/32), Np]: per column a little-endian bit
    stream, row j at bit j*bits."""
    rows, cols = codes.shape
    nwords = -(-rows * bits // 32)
    words = np.zeros((nwords, cols), dtype=np.uint64)
    for j in range(rows):
        pos = j * bits
        w, sh = pos // 32, pos % 32
        v = codes[j].astype(np.uint64) << np.uint64(sh)
        words[w] |= v & np.uint64(0xFFFFFFFF)
        if sh + bits > 32:
            words[w + 1] |= v >> np.uint64(32)
    return words.astype(np.uint32)


def make_exl2_tensors(codes, groups, scale_codes, scale_max, invperm, with_perm, bias=None):
    """codes: [K, Np] codes in quantized-row order; groups: [(bits, rows)]; scale_codes [G, Np]
    in 0..15; scale_max float16 [G]."""
    np_cols = codes.shape[1]
    packed, q_groups, row, qrow = [], [], 0, 0
    for bits, rows in groups:
        p = pack_group(codes[row:row + rows], bits)
        q_groups += [bits, qrow]
        packed.append(p)
        row += rows
        qrow += p.shape[0]
    q_scale = np.zeros((len(groups), np_cols // 8), dtype=np.uint32)
    for n in range(np_cols):
        q_scale[:, n // 8] |= scale_codes[:, n].astype(np.uint32) << np.uint32(4 * (n % 8))
    t = {"q_weight": np.concatenate(packed).view(np.int32),
         "q_scale": q_scale.view(np.int32),
         "q_scale_max": scale_max.astype(np.float16),
         "q_groups": np.array(q_groups, dtype=np.int16),
         "q_invperm": invperm.astype(np.int32)}
    if with_perm:
        t["q_perm"] = np.argsort(invperm).astype(np.int32)
    if bias is not None:
        t["bias"] = bias
    return t


# ---- Dequantization (the reader side, independent of the packer): bit arrays ----

def exl2_dequantize_np(t, out_features):
    qw = t["q_weight"].view(np.uint32)
    total_qrows, np_cols = qw.shape
    qg = t["q_groups"].astype(np.int64).reshape(-1, 2)
    invperm = t["q_invperm"].astype(np.int64)
    k = invperm.shape[0]
    # Every column's bits, least significant first, word after word: [32 * R, Np].
    bits_le = np.unpackbits(qw.astype("<u4").view(np.uint8).reshape(total_qrows, np_cols, 4),
                            axis=2, bitorder="little")            # [R, Np, 32]
    stream = bits_le.transpose(0, 2, 1).reshape(total_qrows * 32, np_cols).astype(np.int64)
    sc_words = t["q_scale"].view(np.uint32)
    sc_bits = np.unpackbits(sc_words.astype("<u4").view(np.uint8), axis=1, bitorder="little")
    sc_codes = (sc_bits.reshape(len(qg), np_cols, 4) * (1 << np.arange(4))).sum(axis=2)
    m = (t["q_scale_max"].astype(np.float32) / np.float32(256)).astype(np.float16)
    rows_q = np.empty((k, np_cols), dtype=np.float16)   # dequantized, in quantized-row order
    row = 0
    for g, (bits, first) in enumerate(qg):
        if g + 1 < len(qg):
            rows = (qg[g + 1][1] - first) * 32 // bits
        else:
            rows = k - row
        weights = 1 << np.arange(bits)
        s = ((sc_codes[g] + 1) ** 2 * m[g].astype(np.float64)).astype(np.float16)
        for j in range(rows):
            b0 = first * 32 + j * bits
            q = (stream[b0:b0 + bits] * weights[:, None]).sum(axis=0)
            rows_q[row + j] = ((q - (1 << (bits - 1))) * s.astype(np.float64)).astype(np.float16)
        row += rows
    assert row == k
    return rows_q[invperm][:, :out_features].T.astype(np.float32).copy()   # [N, K]


# ---- Quantizing real weights (round to nearest with EXL2's scale parametrization) ----

def quantize_real(w, groups, rng):
    """w float [N, K] -> (codes [K, Np], scale codes, scale_max, invperm) by round to nearest
    in a random act-order: a stand-in for ExLlamaV2's optimizer, which only changes which
    codes are chosen, not how they are stored or read."""
    n, k = w.shape
    np_cols = -(-n // 32) * 32
    perm = rng.permutation(k)                       # quantized row r is input row perm[r]
    invperm = np.argsort(perm)
    wt = np.zeros((k, np_cols), dtype=np.float64)
    wt[:, :n] = w.T[perm]
    codes = np.zeros((k, np_cols), dtype=np.int64)
    sc_codes = np.full((len(groups), np_cols), 15, dtype=np.int64)
    smax = np.zeros(len(groups), dtype=np.float16)
    row = 0
    for g, (bits, rows) in enumerate(groups):
        maxq = (1 << bits) - 1
        x = wt[row:row + rows]
        base = (np.abs(x).max(axis=0) + 1e-12) / (maxq / 2)
        top = base[:n].max()
        smax[g] = np.float16(top)
        code1 = np.clip(np.round(np.sqrt(base / float(smax[g])) * 16), 1, 16)
        sc_codes[g] = code1 - 1
        m = np.float16(np.float32(smax[g]) / np.float32(256))
        s = (code1 ** 2 * float(m)).astype(np.float16).astype(np.float64)
        codes[row:row + rows] = np.clip(np.round(x / s) + (1 << (bits - 1)), 0, maxq)
        codes[row:row + rows, n:] = 1 << (bits - 1)  # padding columns hold the zero code
        row += rows
    return codes, sc_codes, smax, invperm


# ---- Layer cases: random codes, every bit width, edge scales ----

LAYER_CASES = [
    # name, out_features, groups [(bits, rows)], act-order, store q_perm, bias, scale_max range
    ("mix_all_widths", 48, [(8, 32), (6, 32), (5, 32), (4, 64), (3, 32), (2, 32)], True, True,
     False, (0.02, 0.2)),
    ("b4_noperm", 32, [(4, 128), (4, 128)], False, True, False, (0.05, 0.1)),
    ("head_8_6_bias", 32, [(8, 128), (6, 128), (6, 128)], True, False, True, (0.01, 0.1)),
    ("b3_partial_last", 40, [(3, 32), (3, 48)], True, False, False, (0.1, 1.0)),
    ("b5_b2_tiny_scales", 64, [(5, 64), (2, 64)], True, True, False, (0.0005, 0.01)),
    ("b6_b2_partial", 8, [(6, 32), (2, 40)], False, False, False, (0.5, 4.0)),
]

# Written with their own generator (the cases above and the tiny Llama keep their bytes).
LAYER_CASES_2 = [
    # ExLlamaV2's down_proj shape of mix: 8 bits g32, 4 bits g128, 3 bits g128 with a short
    # last group (each width's groups are counted by ceil, the layer's last one takes the rest)
    ("exl2_8_4_3_short_last", 32, [(8, 32), (8, 32), (4, 128), (3, 128), (3, 32)], True, False,
     False, (0.02, 0.3)),
    ("b4_short_last", 32, [(4, 128), (4, 64)], True, True, False, (0.05, 0.2)),
    ("b4_uneven", 32, [(4, 64), (4, 32), (4, 64)], True, False, False, (0.05, 0.2)),
    ("b5_g96", 32, [(5, 96), (5, 96)], False, False, False, (0.05, 0.2)),
]


def write_layers(specs, rng):
    os.makedirs(os.path.join(OUT, "layers"), exist_ok=True)
    cases = []
    for name, n, groups, act, with_perm, with_bias, (lo, hi) in specs:
        k = sum(r for _, r in groups)
        np_cols = -(-n // 32) * 32
        codes = np.zeros((k, np_cols), dtype=np.int64)
        row = 0
        for bits, rows in groups:
            codes[row:row + rows] = rng.integers(0, 1 << bits, size=(rows, np_cols))
            row += rows
        sc = rng.integers(0, 16, size=(len(groups), np_cols))
        sc[:, 0], sc[:, 1] = 0, 15                      # both scale code extremes
        smax = rng.uniform(lo, hi, size=len(groups)).astype(np.float16)
        invperm = rng.permutation(k) if act else np.arange(k)
        bias = rng.standard_normal(n).astype(np.float16) if with_bias else None
        t = make_exl2_tensors(codes, groups, sc, smax, invperm, with_perm, bias)
        expected = exl2_dequantize_np(t, n)
        tensors = {"layer." + key: v for key, v in t.items()}
        tensors["expected"] = expected
        write_safetensors(os.path.join(OUT, "layers", name + ".safetensors"), tensors)
        cases.append({"name": name, "in": k, "out": n, "groups": groups})
    return cases


# ---- Tiny Llama from stories260K ----

LLAMA_LAYERS = 2
LLAMA_BITS = {  # per projection: [(bits, rows)] over its input features
    "self_attn.q_proj": [(6, 32), (4, 32)],
    "self_attn.k_proj": [(8, 32), (5, 32)],
    "self_attn.v_proj": [(5, 64)],
    "self_attn.o_proj": [(4, 32), (3, 32)],
    "mlp.gate_proj": [(4, 32), (2, 32)],
    "mlp.up_proj": [(3, 64)],
    "mlp.down_proj": [(6, 64), (4, 64), (3, 44)],
}
HEAD_BITS = [(8, 32), (6, 32)]  # the head has its own bits, as EXL2's head_bits


def write_llama(rng):
    src = read_safetensors(os.path.join(FIXTURES, "stories260K", "model.safetensors"))
    with open(os.path.join(FIXTURES, "stories260K", "config.json")) as f:
        config = json.load(f)
    config.update({"num_hidden_layers": LLAMA_LAYERS, "tie_word_embeddings": False,
                   "torch_dtype": "float16"})
    quant, dense = {}, {}
    embed = src["model.embed_tokens.weight"].astype(np.float16)
    quant["model.embed_tokens.weight"] = dense["model.embed_tokens.weight"] = embed
    quant["model.norm.weight"] = dense["model.norm.weight"] = src["model.norm.weight"]

    def add_linear(prefix, w, groups):
        codes, sc, smax, invperm = quantize_real(w.astype(np.float64), groups, rng)
        t = make_exl2_tensors(codes, groups, sc, smax, invperm, with_perm=False)
        for key, v in t.items():
            quant[prefix + "." + key] = v
        dense[prefix + ".weight"] = exl2_dequantize_np(t, w.shape[0]).astype(np.float16)

    for layer in range(LLAMA_LAYERS):
        for n in ("input_layernorm", "post_attention_layernorm"):
            key = f"model.layers.{layer}.{n}.weight"
            quant[key] = dense[key] = src[key]
        for n, groups in LLAMA_BITS.items():
            p = f"model.layers.{layer}.{n}"
            add_linear(p, src[p + ".weight"], groups)
    add_linear("lm_head", src["lm_head.weight"], HEAD_BITS)
    qc = {"quant_method": "exl2", "version": "0.2.0", "bits": 4.0, "head_bits": 6,
          "calibration": {"rows": 0, "length": 0, "dataset": "(none: round to nearest)"}}
    tok = os.path.join(FIXTURES, "stories260K", "tokenizer.json")
    for sub, tensors, cfg in (("llama", quant, dict(config, quantization_config=qc)),
                              ("llama_float", dense, config)):
        d = os.path.join(OUT, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        shutil.copyfile(tok, os.path.join(d, "tokenizer.json"))


def main():
    rng = np.random.default_rng(20261122)
    cases = write_layers(LAYER_CASES, rng)
    write_llama(rng)
    cases += write_layers(LAYER_CASES_2, np.random.default_rng(20261124))
    with open(os.path.join(OUT, "layers", "cases.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
