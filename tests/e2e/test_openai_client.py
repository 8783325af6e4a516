"""End-to-end: the official `openai` Python client and the `wrk` load tool against `gyre serve`
on 127.0.0.1 with the stories260K fixture on the CPU. Greedy outputs are checked against
`gyre run --temp 0 --json` (the single-sequence generator), which shares no code with the
server's batching engine. Run by scripts/test.sh's e2e stage (GYRE_BIN, GYRE_FIXTURES)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import openai
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GYRE = os.environ.get("GYRE_BIN", str(ROOT / "build" / "gyre"))
FIXTURES = Path(os.environ.get("GYRE_FIXTURES", ROOT.parent / "shared" / "fixtures"))
MODEL = str(FIXTURES / "stories260K")
API_KEY = "e2e-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen(
        [GYRE, "serve", "-m", MODEL, "--device", "cpu", "--threads", "2", "--port", str(port),
         "--api-key", API_KEY, "--chat-template", str(HERE / "chat_template.jinja"),
         "--max-batch", "16", "--max-queue", "64"],
        stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "gyre serve did not come up"
        time.sleep(0.1)
    yield {"proc": proc, "base": base, "port": port}
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key=API_KEY, timeout=60,
                         max_retries=0)


def greedy_reference(prompt, max_tokens):
    out = subprocess.run(
        [GYRE, "run", "-m", MODEL, "--device", "cpu", "-p", prompt, "-n", str(max_tokens),
         "--temp", "0", "--json"],
        check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_models_and_auth(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["stories260K"]
    bad = openai.OpenAI(base_url=server["base"] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_completion_matches_generator(client):
    ref = greedy_reference("Once upon a time", 24)
    r = client.completions.create(model="stories260K", prompt="Once upon a time",
                                  max_tokens=24, temperature=0)
    assert r.choices[0].text == ref["text"]
    assert r.usage.prompt_tokens == len(ref["prompt_tokens"])
    assert r.usage.completion_tokens == ref["stats"]["generated_tokens"]


def test_streaming_completion_matches(client):
    ref = greedy_reference("The little dog", 20)
    stream = client.completions.create(model="gyre", prompt="The little dog", max_tokens=20,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage:
            usage = chunk.usage
    assert text == ref["text"]
    assert usage is not None and usage.completion_tokens == ref["stats"]["generated_tokens"]


def test_chat_and_chat_streaming(client):
    msgs = [{"role": "user", "content": "Tell me a story."}]
    r = client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=16,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert len(r.choices[0].logprobs.content) >= 1
    assert all(lp.logprob <= 0 for lp in r.choices[0].logprobs.content)
    stream = client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=16,
                                            temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == content


def test_errors_are_openai_shaped(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="gyre", prompt="x", max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_load_with_wrk(server):
    wrk = shutil.which("wrk")
    if wrk is None:
        pytest.skip("wrk is not installed (scripts/install_deps.sh installs it)")
    lua = HERE / "post_completion.lua"
    out = subprocess.run(
        [wrk, "-t2", "-c16", "-d4s", "--timeout", "10s", "-s", str(lua),
         "-H", f"Authorization: Bearer {API_KEY}", server["base"] + "/v1/completions"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    print(out)
    assert "Non-2xx" not in out, out
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    assert requests > 0
    req = urllib.request.Request(server["base"] + "/metrics",
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        metrics = r.read().decode()
    total = float(re.search(r"^gyre_requests_finished_total (\S+)$", metrics, re.M).group(1))
    assert total >= requests


def test_sigterm_drains_and_exits_zero(server, client):
    proc = server["proc"]
    stream = client.completions.create(model="gyre", prompt="Once", max_tokens=200,
                                       temperature=0, stream=True)
    first = next(iter(stream))
    proc.send_signal(signal.SIGTERM)
    text = (first.choices[0].text if first.choices else "") + "".join(
        c.choices[0].text for c in stream if c.choices)
    assert proc.wait(timeout=60) == 0
    ref = greedy_reference("Once", 200)
    assert text == ref["text"]
