-- wrk script: every request is the same greedy completion (wrk sends GET without one).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "gyre", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'
