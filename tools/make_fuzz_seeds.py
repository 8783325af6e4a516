#!/usr/bin/env python3
"""Writes the tiny seed files of the fuzz targets (fuzz/seeds/<target>/) with gguf-py and the
standard library. Run from the repository root: python3 tools/make_fuzz_seeds.py"""
import json
import shutil
import struct

import numpy as np
import gguf

Q = gguf.GGMLQuantizationType


def mini_llama(path):
    w = gguf.GGUFWriter(path, "llama")
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_block_count(1)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(16)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "a"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    w.add_token_types([2, 3, 3, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(1)

    def t(name, shape, q=None):
        d = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if q is None:
            w.add_tensor(name, d)
        else:
            w.add_tensor(name, gguf.quants.quantize(d, q), raw_dtype=q)

    t("token_embd.weight", (4, 32), Q.Q8_0)
    t("output_norm.weight", (32,))
    t("blk.0.attn_norm.weight", (32,))
    t("blk.0.ffn_norm.weight", (32,))
    t("blk.0.attn_q.weight", (32, 32), Q.Q4_0)
    t("blk.0.attn_k.weight", (16, 32), Q.Q4_1)
    t("blk.0.attn_v.weight", (16, 32), Q.Q8_0)
    t("blk.0.attn_output.weight", (32, 32))
    t("blk.0.ffn_gate.weight", (32, 32), Q.Q8_0)
    t("blk.0.ffn_up.weight", (32, 32), Q.Q8_0)
    t("blk.0.ffn_down.weight", (32, 32), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def small_safetensors(path):
    hdr = json.dumps({"__metadata__": {"format": "pt"},
                      "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                      "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + bytes(range(22)))


if __name__ == "__main__":
    mini_llama("fuzz/seeds/fuzz_gguf/mini_llama.gguf")
    shutil.copy("tests/data/meta_types.gguf", "fuzz/seeds/fuzz_gguf/meta_types.gguf")
    small_safetensors("fuzz/seeds/fuzz_safetensors/small.safetensors")
