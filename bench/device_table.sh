# Sourced by the session device scripts after bench/device_binaries.sh: the final table of a
# session (gyre bench on the synthetic Llama-3-8B at FP16, 8, 6 and 4 bits with -p 2048, Mistral-7B
# FP16, then 4-bit serving at 1/8/32 requests), appended to $O/table.log.
for arm in "llama3-8b 16" "llama3-8b 8" "llama3-8b 6" "llama3-8b 4" "mistral-7b 16"; do
  set -- $arm
  timeout 100 $B/gyre bench --synthetic $1 --bits $2 -p 2048 -n 128 --long 8192 --json \
    >"$O/t.json" 2>/dev/null
  python3 -c "import json; d=json.load(open('$O/t.json')); print('$1 bits $2: prefill 2048 %.0f tok/s, decode@128 %.1f (%.1f%%) @8k %.1f (%.1f%%) bw %.0f' % (d['prefill_tok_s'], d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['bandwidth_gb_s']))" 2>&1 | tee -a "$O/table.log"
done
timeout 200 $B/gyre bench --synthetic llama3-8b --bits 4 -n 128 -p 16 --concurrency 1,8,32 \
  2>&1 | tail -8 | tee -a "$O/table.log"
