#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers (float32, CPU), for Gyre's tests.

1. Tiny random-weight models, one per architecture variant Gyre supports (Llama 3 with GQA and
   llama3 rope scaling, Llama 2 with linear and with dynamic-NTK rope scaling, Mistral with a
   sliding window, Qwen2 with q/k/v biases, tied embeddings). Each is written as an HF folder
   (config.json + model.safetensors, float32) under tests/data/hf_tiny/<name>/ together with
   `reference.json`: the input ids and transformers' logits for every position.
2. SmolLM2-135M-Instruct from its GGUF file (transformers dequantizes it with the gguf package):
   tests/data/smollm2_hf_reference.json holds the prompt, transformers' own token ids for it, and
   its logits (top 20 per position, the full last row).

Run: python tools/make_hf_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs torch, transformers, gguf, safetensors (any recent versions; the versions used are
recorded in the output files).
"""
import json
import os
import sys
import zlib

import torch
import transformers
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data")

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2)

VARIANTS = {
    "llama3_gqa_ropescaled": (LlamaConfig, LlamaForCausalLM, dict(
        rope_theta=500000.0, max_position_embeddings=256, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama2_linear_rope": (LlamaConfig, LlamaForCausalLM, dict(
        num_key_value_heads=4, max_position_embeddings=64,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama2_dynamic_ntk": (LlamaConfig, LlamaForCausalLM, dict(
        num_key_value_heads=4, max_position_embeddings=16,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "mistral_sliding_window": (MistralConfig, MistralForCausalLM, dict(
        sliding_window=8, max_position_embeddings=256, rope_theta=1000000.0, head_dim=16)),
    "qwen2_yarn": (Qwen2Config, Qwen2ForCausalLM, dict(
        max_position_embeddings=64, rope_theta=10000.0, use_sliding_window=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "qwen2_bias": (Qwen2Config, Qwen2ForCausalLM, dict(
        max_position_embeddings=256, rope_theta=1000000.0, use_sliding_window=False,
        tie_word_embeddings=False)),
}

# Published Llama 2/3.1 checkpoints write rope_theta and rope_scaling at the top level; newer
# transformers writes rope_parameters. These variants are rewritten in the published form so that
# both spellings are tested.
LEGACY_ROPE_FORMAT = {"llama3_gqa_ropescaled", "llama2_linear_rope", "qwen2_yarn"}


def legacy_rope_config(path):
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


SEQ = [1, 17, 200, 3, 99, 45, 128, 255, 7, 64, 31, 2, 180, 90, 12, 5, 77, 150, 33, 8, 240, 11,
       101, 66]


def tiny_models():
    for name, (cfg_cls, model_cls, extra) in VARIANTS.items():
        torch.manual_seed(zlib.crc32(name.encode()) % 1000)
        kw = dict(COMMON)
        kw.update(extra)
        cfg = cfg_cls(**kw)
        cfg._attn_implementation = "eager"
        model = model_cls(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():  # bigger than the default init so attention matters
                p.normal_(0.0, 0.15)
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.uniform_(0.5, 1.5)
        d = os.path.join(OUT, "hf_tiny", name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        if name in LEGACY_ROPE_FORMAT:
            legacy_rope_config(os.path.join(d, "config.json"))
        with torch.no_grad():
            logits = model(torch.tensor([SEQ])).logits[0].float()
        ref = {"made_by": f"tools/make_hf_reference.py, transformers {transformers.__version__}, "
                          f"torch {torch.__version__}, float32 eager attention on the CPU",
               "input_ids": SEQ,
               "logits": [[round(float(v), 6) for v in row] for row in logits]}
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        print("wrote", d)


def smollm2(gguf_path):
    d, fname = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=fname, dtype=torch.float32)
    model.eval()
    prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "input_ids"):
        chat_ids = chat_ids["input_ids"]
    cases = []
    for text, ids in [(p, tok(p)["input_ids"]) for p in prompts] + [("<chat>", list(chat_ids))]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        top = torch.topk(logits, 20, dim=-1)
        greedy = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0]
        cases.append({
            "text": text,
            "input_ids": list(map(int, ids)),
            "top20_ids": top.indices.tolist(),
            "top20_logits": [[round(float(v), 5) for v in r] for r in top.values],
            "last_top200_ids": torch.topk(logits[-1], 200).indices.tolist(),
            "last_top200_logits": [round(float(v), 5) for v in torch.topk(logits[-1], 200).values],
            "greedy_ids": list(map(int, greedy[len(ids):])),
            "greedy_text": tok.decode(greedy[len(ids):]),
        })
    ref = {"made_by": f"tools/make_hf_reference.py: transformers {transformers.__version__} "
                      f"AutoModelForCausalLM.from_pretrained(gguf_file=SmolLM2-135M-Instruct.Q4_1"
                      f".gguf) (weights dequantized by the gguf package), float32 on the CPU, "
                      f"torch {torch.__version__}",
           "chat_messages": messages, "cases": cases}
    with open(os.path.join(OUT, "smollm2_hf_reference.json"), "w") as f:
        json.dump(ref, f)
    print("wrote smollm2 reference; greedy:", [c["greedy_text"] for c in cases])


if __name__ == "__main__":
    tiny_models()
    if len(sys.argv) > 1:
        smollm2(sys.argv[1])
