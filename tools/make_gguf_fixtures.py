#!/usr/bin/env python3
"""Generates Gyre's GGUF test fixtures under tests/data/ with the reference implementation of
someone else: the `gguf` Python package (gguf-py, from llama.cpp; `pip install gguf numpy`).

  quant_<TYPE>.bin / quant_<TYPE>.f32: random blocks of each quantized type (fixed seed; random
      quant bytes, finite random f16 scales including zero and subnormal ones) and their
      dequantization by gguf.quants.dequantize (float32, little-endian).
  tiny_llama.gguf + tiny_llama.json: a tiny llama-architecture model written by gguf.GGUFWriter
      (random weights in several tensor types, a small vocab, a chat template) and what
      gguf.GGUFReader reads back from it (config keys, vocab, tensor shapes, dequantized slices).
  meta_types.gguf + meta_types.json: one metadata key of every GGUF value type, nested arrays
      included, and their values as GGUFReader reads them.
  smollm2_expected.json: (only when models/SmolLM2-135M-Instruct.Q4_1.gguf exists) metadata and
      a few dequantized tensor slices of the real SmolLM2-135M-Instruct Q4_1 file, read by
      gguf.GGUFReader and gguf.quants.dequantize.

Run from the repository root: python3 tools/make_gguf_fixtures.py
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

OUT = "tests/data"
QTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
# Offsets of the f16 scale fields inside one block of each type.
SCALE_OFFSETS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2],
                 "Q6_K": [208]}


def random_f16(rng, n):
    """Finite half floats over many magnitudes, both signs, some zero and some subnormal."""
    mag = 10.0 ** rng.uniform(-6, 1, n)
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    v[rng.random(n) < 0.05] = 0
    v[rng.random(n) < 0.05] = np.float16(3e-6)  # subnormal in half
    assert np.all(np.isfinite(v))
    return v


def random_blocks(rng, name, n_blocks):
    """Random quant bytes with finite f16 scales."""
    block_bytes = gguf.GGML_QUANT_SIZES[QT[name]][1]
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:
        raw[:, off:off + 2] = random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def make_quant_fixtures(rng):
    for name in QTYPES:
        qt = QT[name]
        block_elems = gguf.GGML_QUANT_SIZES[qt][0]
        n_blocks = 64 if block_elems == 32 else 12
        raw = random_blocks(rng, name, n_blocks)
        ref = gguf.quants.dequantize(raw.reshape(1, -1), qt).astype("<f4").reshape(-1)
        assert ref.size == n_blocks * block_elems and np.all(np.isfinite(ref))
        raw.tofile(f"{OUT}/quant_{name}.bin")
        ref.tofile(f"{OUT}/quant_{name}.f32")


def f32_list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def tensor_slices(reader, names, rows, cols):
    """First `cols` values of the given rows of each tensor, dequantized by gguf-py."""
    out = {}
    for t in reader.tensors:
        if t.name not in names:
            continue
        full = gguf.quants.dequantize(t.data, t.tensor_type)
        full = full.reshape(-1, int(t.shape[0]))  # rows of ne[0] elements
        out[t.name] = {str(r): f32_list(full[r, :cols]) for r in rows if r < full.shape[0]}
    return out


def field_value(f):
    return f.contents()


def make_tiny_llama(rng):
    path = f"{OUT}/tiny_llama.gguf"
    arch = "llama"
    dim, ffn, layers, heads, kv_heads, vocab = 32, 256, 2, 4, 2, 40
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(50000.0)
    w.add_rope_dimension_count(dim // heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_rope_scaling_orig_ctx_len(128)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(8)] + \
        ["\u2581" + chr(ord("a") + i) for i in range(vocab - 11)]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(vocab)])
    w.add_token_types([2, 3, 3] + [6] * 8 + [1] * (vocab - 11))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    head_dim = dim // heads

    def add(name, shape_out_in, qtype):
        data = rng.standard_normal(shape_out_in).astype(np.float32) * 0.1
        if qtype == "F32":
            w.add_tensor(name, data)
        elif qtype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        elif qtype.endswith("_K"):  # gguf-py cannot quantize K types: random valid blocks
            w.add_tensor(name, random_blocks(rng, qtype, data.size // 256).reshape(
                shape_out_in[0], -1), raw_dtype=QT[qtype])
        else:
            q = gguf.quants.quantize(data, QT[qtype])
            w.add_tensor(name, q, raw_dtype=QT[qtype])

    add("token_embd.weight", (vocab, dim), "F16")
    add("output_norm.weight", (dim,), "F32")
    add("output.weight", (vocab, dim), "Q8_0")
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (dim,), "F32")
        add(f"blk.{i}.ffn_norm.weight", (dim,), "F32")
        add(f"blk.{i}.attn_q.weight", (heads * head_dim, dim), "Q8_0")
        add(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, dim), "Q4_0")
        add(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, dim), "Q4_1")
        add(f"blk.{i}.attn_output.weight", (dim, heads * head_dim), "F16")
        add(f"blk.{i}.ffn_gate.weight", (ffn, dim), "Q4_0")
        add(f"blk.{i}.ffn_up.weight", (ffn, dim), "Q4_1")
        add(f"blk.{i}.ffn_down.weight", (dim, ffn), "Q6_K" if i == 0 else "Q4_K")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(path)
    fields = {k: field_value(f) for k, f in r.fields.items()
              if not k.startswith("GGUF.") and k != "tokenizer.ggml.scores"}
    fields["tokenizer.ggml.scores"] = f32_list(r.fields["tokenizer.ggml.scores"].contents())
    expected = {
        "fields": fields,
        "tensors": {t.name: {"ne": [int(x) for x in t.shape], "type": t.tensor_type.name,
                             "n_bytes": int(t.n_bytes)} for t in r.tensors},
        "slices": tensor_slices(r, {t.name for t in r.tensors}, [0, 5], 32),
    }
    with open(f"{OUT}/tiny_llama.json", "w") as f:
        json.dump(expected, f, separators=(",", ":"))


def make_meta_types():
    path = f"{OUT}/meta_types.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5e-7)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u2581world")
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float64("t.f64", 2.718281828459045)
    w.add_key_value("t.arr_i16", [1, -2, 3], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr_f64", [0.5, -1.25], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.arr_str", ["a", "", "xyz"])
    w.add_array("t.arr_nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("t.arr_nested_str", [["x", "y"], ["z"]])
    w.add_custom_alignment(64)
    f32 = np.arange(16, dtype=np.float32)
    w.add_tensor("a", f32)
    w.add_tensor("b", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(path)
    expected = {"fields": {k: f.contents() for k, f in r.fields.items() if k.startswith("t.")},
                "types": {k: [int(t) for t in f.types] for k, f in r.fields.items()},
                # GGUFReader flattens nested arrays; these are what the writer was given.
                "nested_input": {"t.arr_nested": [[1, 2], [3], [4, 5, 6]],
                                 "t.arr_nested_str": [["x", "y"], ["z"]]},
                "tensor_offsets": {t.name: int(t.data_offset) for t in r.tensors}}
    with open(f"{OUT}/meta_types.json", "w") as f:
        json.dump(expected, f, separators=(",", ":"))


def make_smollm2_expected():
    path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.exists(path):
        print(f"{path} missing: skipping smollm2_expected.json", file=sys.stderr)
        return
    r = gguf.GGUFReader(path)
    keys = ["general.architecture", "llama.context_length", "llama.embedding_length",
            "llama.feed_forward_length", "llama.block_count", "llama.attention.head_count",
            "llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon",
            "llama.rope.freq_base", "llama.rope.dimension_count", "llama.vocab_size",
            "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
            "tokenizer.chat_template"]
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
             "blk.29.ffn_down.weight", "output_norm.weight", "blk.3.attn_norm.weight"]
    expected = {
        "fields": {k: r.fields[k].contents() for k in keys},
        "n_tokens": len(tokens),
        "tokens_sample": {str(i): tokens[i] for i in [0, 1, 2, 100, 1000, 49151]},
        "n_merges": len(merges),
        "merges_sample": {str(i): merges[i] for i in [0, 1, 1000, len(merges) - 1]},
        "n_tensors": len(r.tensors),
        "tensors": {t.name: {"ne": [int(x) for x in t.shape], "type": t.tensor_type.name}
                    for t in r.tensors if t.name in names},
        "slices": tensor_slices(r, set(names), [0, 7, 191], 48),
    }
    with open(f"{OUT}/smollm2_expected.json", "w") as f:
        json.dump(expected, f, separators=(",", ":"))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240611)
    make_quant_fixtures(rng)
    make_tiny_llama(rng)
    make_meta_types()
    make_smollm2_expected()


if __name__ == "__main__":
    main()
