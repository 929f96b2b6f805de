#!/usr/bin/env python3
"""Checks an OpenAI-compatible server on this machine (`fl serve`) with real clients: the
official `openai` Python package and curl.

Start the server first (GPU machine), then point this script at it:

    cargo build --release -p fl-engine --bin fl
    target/release/fl serve --model /path/to/llama-dir --port 8000 &
    # wait until `curl -s http://127.0.0.1:8000/health` answers 200, then
    python3 bench/scripts/check_openai_client.py --base-url http://127.0.0.1:8000

With `fl serve --api-key KEY`, pass `--api-key KEY` (or set OPENAI_API_KEY). The model needs a
`chat_template` in tokenizer_config.json for the chat checks; without one the server answers 400
and those checks print SKIP.

Checks: GET /health and /v1/models (curl and openai); completions non-streaming and streaming;
chat non-streaming and streaming with `stream_options.include_usage` (role chunk first, content
deltas, finish_reason, a usage-only last chunk, `data: [DONE]`); raw SSE framing through curl; a
stop string (streamed and not: output cut before it, finish_reason "stop"); beam search through
vLLM's extra fields (`extra_body={"use_beam_search": True, ...}`, `best_of` the width: n choices,
one beam equal to greedy); bad requests (negative max_tokens, malformed JSON, streaming a beam
search) answered 400 with `{"error": {"message", "type", "param", "code"}}`. Each prints PASS / FAIL / SKIP; the exit status is 1 if any failed. Without the
`openai` package installed the script prints SKIP and exits 0. Only loopback targets.
"""

import argparse
import json
import os
import subprocess
import sys
import urllib.parse

RESULTS = []


def report(status, name, detail=""):
    RESULTS.append((status, name))
    print(f"{status} {name}" + (f": {detail}" if detail else ""), flush=True)


def check(name):
    """Runs the decorated check, turning an exception into FAIL and a `Skip` into SKIP."""

    def wrap(fn):
        def run(*a, **kw):
            skipped = [s for s in SKIP_NAMES if s in name]
            if skipped:
                report("SKIP", name, f"--skip {skipped[0]!r}")
                return
            try:
                detail = fn(*a, **kw)
                report("PASS", name, detail or "")
            except Skip as e:
                report("SKIP", name, str(e))
            except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
                report("FAIL", name, f"{type(e).__name__}: {e}")

        return run

    return wrap


class Skip(Exception):
    pass


# Checks whose name contains one of these are skipped (--skip).
SKIP_NAMES = []


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def loopback_url(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"--base-url {url}: only http:// to 127.0.0.1, ::1 or localhost")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"http://{u.netloc}{path}"


class Curl:
    def __init__(self, base, api_key, timeout):
        self.base, self.api_key, self.timeout = base, api_key, timeout

    def __call__(self, method, path, body=None, raw=None):
        """(status, body text) of one request; `raw` sends bytes as they are."""
        marker = "\n__HTTP_STATUS__"
        cmd = ["curl", "-sS", "-N", "--max-time", str(self.timeout), "-X", method,
               "-w", marker + "%{http_code}", self.base + path]
        if self.api_key:
            cmd += ["-H", f"Authorization: Bearer {self.api_key}"]
        data = None
        if body is not None or raw is not None:
            data = raw if raw is not None else json.dumps(body).encode()
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        p = subprocess.run(cmd, input=data, capture_output=True, timeout=self.timeout + 10)
        out = p.stdout.decode("utf-8", "replace")
        if p.returncode != 0 or marker not in out:
            raise AssertionError(f"curl exit {p.returncode}: {p.stderr.decode(errors='replace')}")
        text, status = out.rsplit(marker, 1)
        return int(status), text


def check_openai_error(status, text, field=None):
    expect(status == 400, f"status {status}, want 400: {text[:200]}")
    err = json.loads(text).get("error")
    expect(isinstance(err, dict), f"no error object: {text[:200]}")
    for k in ("message", "type", "param", "code"):
        expect(k in err, f"error has no `{k}`: {err}")
    expect(isinstance(err["message"], str) and err["message"], f"empty message: {err}")
    if field:
        expect(err["param"] == field or field in err["message"],
               f"error names neither param `{field}` nor mentions it: {err}")
    return err


def sse_payloads(text):
    """The `data:` payloads of a raw SSE body, checking its framing on the way."""
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    payloads = []
    for e in events:
        lines = [ln for ln in e.split("\n") if not ln.startswith(":")]
        if not lines:
            continue  # a comment-only event (keep-alive)
        expect(all(ln.startswith("data:") for ln in lines), f"not a data event: {e[:120]!r}")
        payloads.append("\n".join(ln[5:].lstrip(" ") for ln in lines))
    expect(payloads and payloads[-1] == "[DONE]", "the stream does not end with data: [DONE]")
    return payloads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="default: the first of GET /v1/models")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--skip", action="append", default=[], metavar="SUBSTRING",
                    help="skip the checks whose name contains it (repeatable)")
    args = ap.parse_args()
    SKIP_NAMES.extend(args.skip)
    base = loopback_url(args.base_url)
    try:
        import openai
    except ImportError:
        print("SKIP check_openai_client: the `openai` package is not installed "
              "(pip install openai)")
        return 0

    curl = Curl(base, args.api_key, args.timeout)
    client = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key or "none",
                           timeout=args.timeout, max_retries=0)
    n = args.max_tokens
    model = args.model
    state = {}

    @check("GET /health (curl)")
    def health():
        status, text = curl("GET", "/health")
        expect(status == 200, f"status {status}: {text[:200]}")

    @check("GET /v1/models (curl)")
    def models_curl():
        status, text = curl("GET", "/v1/models")
        expect(status == 200, f"status {status}: {text[:200]}")
        v = json.loads(text)
        expect(v.get("object") == "list" and v.get("data"), f"not a model list: {text[:200]}")
        expect(all(m.get("object") == "model" and m.get("id") for m in v["data"]), text[:200])

    @check("models.list (openai)")
    def models_openai():
        ids = [m.id for m in client.models.list().data]
        expect(ids, "no model listed")
        state["model"] = model or ids[0]
        return f"model {state['model']}"

    health()
    models_curl()
    models_openai()
    if "model" not in state:
        if not model:
            report("FAIL", "a model to use", "GET /v1/models failed and no --model given")
            return summary()
        state["model"] = model
    model = state["model"]
    greedy = dict(model=model, temperature=0.0, max_tokens=n, extra_body={"ignore_eos": True})

    def usage_ok(u, completion):
        expect(u is not None, "no usage")
        expect(u.completion_tokens == completion,
               f"usage.completion_tokens {u.completion_tokens}, want {completion}")
        expect(u.prompt_tokens > 0, f"usage.prompt_tokens {u.prompt_tokens}")
        expect(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")

    @check("completions, not streamed (openai)")
    def completions():
        r = client.completions.create(prompt="The capital of France is", **greedy)
        expect(r.object == "text_completion", f"object {r.object}")
        c = r.choices[0]
        expect(isinstance(c.text, str), "no text")
        expect(c.finish_reason == "length", f"finish_reason {c.finish_reason}, want length")
        usage_ok(r.usage, n)
        state["text"] = c.text
        return f"{c.text!r}"

    @check("completions, streamed with include_usage (openai)")
    def completions_stream():
        chunks = list(client.completions.create(
            prompt="The capital of France is", stream=True,
            stream_options={"include_usage": True}, **greedy))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        expect(reasons and reasons[-1] == "length", f"finish reasons {reasons}")
        usage = [c.usage for c in chunks if c.usage]
        expect(len(usage) == 1 and chunks[-1].usage, "usage is not in the last chunk only")
        expect(not chunks[-1].choices, "the usage chunk carries choices")
        usage_ok(usage[0], n)
        if "text" in state:
            expect(text == state["text"], f"streamed {text!r} != not streamed {state['text']!r}")
        return f"{len(chunks)} chunks"

    @check("completions (curl)")
    def completions_curl():
        status, text = curl("POST", "/v1/completions", {
            "model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True})
        expect(status == 200, f"status {status}: {text[:200]}")
        v = json.loads(text)
        expect(v["choices"][0]["finish_reason"] == "length", text[:200])
        expect(v["usage"]["completion_tokens"] == 4, text[:200])

    @check("completions, raw SSE framing (curl)")
    def completions_sse_curl():
        status, text = curl("POST", "/v1/completions", {
            "model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        expect(status == 200, f"status {status}: {text[:200]}")
        payloads = sse_payloads(text)
        chunks = [json.loads(p) for p in payloads[:-1]]
        expect(chunks[-1].get("usage", {}).get("completion_tokens") == 4,
               f"last chunk before [DONE]: {payloads[-2][:200]}")
        return f"{len(payloads)} events"

    chat_msgs = [{"role": "system", "content": "You are terse."},
                 {"role": "user", "content": "Name a colour."}]

    @check("chat, not streamed (openai)")
    def chat():
        try:
            r = client.chat.completions.create(messages=chat_msgs, **greedy)
        except openai.BadRequestError as e:
            if "template" in str(e).lower():
                state["no_template"] = str(e)
                raise Skip(f"the model has no chat template (400: {e})")
            raise
        expect(r.object == "chat.completion", f"object {r.object}")
        m = r.choices[0].message
        expect(m.role == "assistant" and isinstance(m.content, str), f"message {m}")
        expect(r.choices[0].finish_reason == "length", f"finish {r.choices[0].finish_reason}")
        usage_ok(r.usage, n)
        state["chat_text"] = m.content
        return f"{m.content!r}"

    @check("chat, streamed with include_usage (openai)")
    def chat_stream():
        if "no_template" in state:
            raise Skip("the model has no chat template")
        chunks = list(client.chat.completions.create(
            messages=chat_msgs, stream=True, stream_options={"include_usage": True}, **greedy))
        expect(chunks and chunks[0].choices and chunks[0].choices[0].delta.role == "assistant",
               "the first chunk does not carry the role")
        expect(chunks[0].object == "chat.completion.chunk", f"object {chunks[0].object}")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        expect(reasons[-1] == "length", f"finish reasons {reasons}")
        expect(chunks[-1].usage and not chunks[-1].choices, "no usage-only last chunk")
        usage_ok(chunks[-1].usage, n)
        if "chat_text" in state:
            expect(text == state["chat_text"],
                   f"streamed {text!r} != not streamed {state['chat_text']!r}")
        return f"{len(chunks)} chunks"

    @check("chat, raw SSE framing (curl)")
    def chat_sse_curl():
        if "no_template" in state:
            raise Skip("the model has no chat template")
        status, text = curl("POST", "/v1/chat/completions", {
            "model": model, "messages": chat_msgs, "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "stream": True})
        expect(status == 200, f"status {status}: {text[:200]}")
        payloads = sse_payloads(text)
        first = json.loads(payloads[0])
        expect(first["choices"][0]["delta"].get("role") == "assistant", payloads[0][:200])
        return f"{len(payloads)} events"

    @check("logprobs: completions and chat, streamed or not (openai)")
    def logprobs():
        r = client.completions.create(prompt="The capital of France is", logprobs=3, **greedy)
        lp = r.choices[0].logprobs
        expect(lp is not None and len(lp.token_logprobs) == n, f"logprobs {lp}")
        expect(all(x <= 0 for x in lp.token_logprobs), f"token_logprobs {lp.token_logprobs}")
        expect(all(1 <= len(t) <= 3 for t in lp.top_logprobs), f"top_logprobs {lp.top_logprobs}")
        # Greedy: each generated token is the most likely one.
        expect(all(abs(max(t.values()) - x) < 1e-4 for t, x in
                   zip(lp.top_logprobs, lp.token_logprobs)), "a greedy token below the top one")
        if "no_template" in state:
            return f"completions {len(lp.tokens)} tokens; chat skipped (no template)"
        c = client.chat.completions.create(messages=chat_msgs, logprobs=True, top_logprobs=2,
                                           **greedy)
        content = c.choices[0].logprobs.content
        expect(len(content) == n, f"{len(content)} entries for {n} tokens")
        expect(all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content), f"{content[:2]}")
        chunks = list(client.chat.completions.create(messages=chat_msgs, logprobs=True,
                                                     stream=True, **greedy))
        streamed = [e.token for ch in chunks if ch.choices and ch.choices[0].logprobs
                    for e in ch.choices[0].logprobs.content]
        expect(streamed == [e.token for e in content], "streamed tokens differ")
        return f"completions {len(lp.tokens)} tokens, chat {len(content)}"

    @check("stop string, not streamed and streamed (openai)")
    def stop_string():
        # Greedy output is reproducible: stop on a piece of it and expect what comes before.
        full = client.completions.create(prompt="Once upon a time", **dict(greedy, max_tokens=24))
        text = full.choices[0].text
        core = text.strip()
        if len(core) < 4:
            raise Skip(f"greedy output {text!r} is too short to take a stop string from")
        mid = text.find(core) + len(core) // 2
        stop = text[mid:mid + 2]
        if not stop.strip():
            stop = core[-2:]
        want = text[: text.find(stop)]
        r = client.completions.create(prompt="Once upon a time", stop=[stop],
                                      **dict(greedy, max_tokens=24))
        c = r.choices[0]
        expect(c.finish_reason == "stop", f"finish_reason {c.finish_reason} with stop {stop!r}")
        expect(c.text == want, f"text {c.text!r}, want {want!r} (stop {stop!r}, full {text!r})")
        chunks = list(client.completions.create(
            prompt="Once upon a time", stop=[stop], stream=True, **dict(greedy, max_tokens=24)))
        streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        expect(streamed == want, f"streamed {streamed!r}, want {want!r} (stop {stop!r})")
        reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        expect(reasons[-1] == "stop", f"streamed finish reasons {reasons}")
        return f"stop {stop!r} -> {want!r}"

    @check("beam search, n=2 of best_of=3 and one beam = greedy (openai, extra_body)")
    def beam_search():
        beams = dict(extra_body={"use_beam_search": True, "length_penalty": 1.0,
                                 "early_stopping": False})
        r = client.completions.create(model=model, prompt="The capital of France is",
                                      max_tokens=n, n=2, best_of=3, **beams)
        expect(len(r.choices) == 2, f"{len(r.choices)} choices, want 2")
        for i, c in enumerate(r.choices):
            expect(c.index == i and isinstance(c.text, str), f"choice {i}: {c}")
            expect(c.finish_reason in ("stop", "length"), f"choice {i}: {c.finish_reason}")
        u = r.usage
        expect(0 < u.completion_tokens <= 2 * n, f"usage.completion_tokens {u.completion_tokens}")
        expect(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
        # One beam without end ids is greedy decoding (transformers' num_beams=1).
        one = client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=n, temperature=0.0,
            extra_body=dict(beams["extra_body"], ignore_eos=True))
        expect(one.choices[0].finish_reason == "length", f"finish {one.choices[0].finish_reason}")
        if "text" in state:
            expect(one.choices[0].text == state["text"],
                   f"one beam {one.choices[0].text!r} != greedy {state['text']!r}")
        return f"{[c.text for c in r.choices]!r}"

    @check("bad request: stream with use_beam_search (curl, 400 naming stream)")
    def bad_beam_stream_curl():
        status, text = curl("POST", "/v1/completions", {
            "model": model, "prompt": "Hi", "max_tokens": 4, "use_beam_search": True,
            "stream": True})
        return check_openai_error(status, text, field="stream")["message"]

    @check("bad request: max_tokens -1 (curl, 400 + OpenAI error)")
    def bad_max_tokens_curl():
        status, text = curl("POST", "/v1/completions",
                            {"model": model, "prompt": "Hi", "max_tokens": -1})
        err = check_openai_error(status, text, field="max_tokens")
        return err["message"]

    @check("bad request: malformed JSON (curl, 400 + OpenAI error)")
    def bad_json_curl():
        status, text = curl("POST", "/v1/completions", raw=b'{"model": "x", "prompt": ')
        return check_openai_error(status, text)["message"]

    @check("bad request: max_tokens -1 (openai raises BadRequestError)")
    def bad_openai():
        try:
            client.completions.create(model=model, prompt="Hi", max_tokens=-1)
        except openai.BadRequestError as e:
            expect(e.status_code == 400, f"status {e.status_code}")
            return str(e)[:120]
        raise AssertionError("no error for max_tokens -1")

    for c in (completions, completions_stream, completions_curl, completions_sse_curl, chat,
              chat_stream, chat_sse_curl, logprobs, stop_string, beam_search, bad_max_tokens_curl,
              bad_json_curl, bad_beam_stream_curl, bad_openai):
        c()
    return summary()


def summary():
    count = {s: sum(1 for r in RESULTS if r[0] == s) for s in ("PASS", "FAIL", "SKIP")}
    failed = [name for s, name in RESULTS if s == "FAIL"]
    print(f"summary: {count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} skipped"
          + (f" (failed: {'; '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
