#!/usr/bin/env python3
"""Misbehaving clients against an OpenAI-compatible server on this machine (`fl serve`): every
bad request must get a clear 4xx, with the OpenAI error object where the API answers, and the
server must keep serving. Python standard library only.

    python3 bench/scripts/abuse_client.py --base-url http://127.0.0.1:8000 \\
        [--rounds 3] [--max-seconds 120] [--hold 1000] [--token-id 5]

Each round sends: malformed JSON; a body that is not UTF-8; a JSON array as the body; wrong
types (max_tokens and temperature as strings, the prompt as an object, messages not a list);
negative and huge max_tokens; a token id past any vocabulary; a 1 MB prompt; unknown fields
(served: 200); a streamed request whose client disconnects after the first chunk and a
non-streamed one that disconnects before its answer; an unknown path (404) and a wrong method
(405). After every round one good request (token-id prompt, 4 greedy tokens, ignore_eos) must
come back whole. `--hold N` keeps N idle connections open for the whole run (raise `ulimit -n`
past N first if the soft limit is lower; the script tries). Prompts are token ids (`--token-id`,
below the model's vocabulary), so a model without a tokenizer (a preset) works too.

Prints one line per check (PASS / FAIL) and a summary; exit status 1 if any check failed: a 5xx,
no answer, a 4xx without the error object, or a good request that did not come back whole.
Bounded: `--rounds` rounds and at most `--max-seconds` in all. Only loopback targets.
"""

import argparse
import json
import socket
import sys
import time
import urllib.parse

RESULTS = []


def report(ok, name, detail=""):
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)


class Target:
    def __init__(self, url, timeout, api_key):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
            sys.exit(f"--base-url {url}: only http:// to 127.0.0.1, ::1 or localhost")
        self.host, self.port = u.hostname, u.port or 80
        self.timeout, self.api_key = timeout, api_key

    def connect(self):
        s = socket.create_connection((self.host, self.port), timeout=self.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def head(self, method, path, length, ctype="application/json"):
        h = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close"]
        if self.api_key:
            h.append(f"Authorization: Bearer {self.api_key}")
        if length is not None:
            h += [f"Content-Type: {ctype}", f"Content-Length: {length}"]
        return ("\r\n".join(h) + "\r\n\r\n").encode()

    def request(self, method, path, body=None):
        """(status, body bytes) of one request on a fresh connection; `body`: bytes or JSON."""
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        with self.connect() as s:
            s.sendall(self.head(method, path, None if body is None else len(body)))
            if body:
                s.sendall(body)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        if b"transfer-encoding: chunked" in head.lower():
            rest = dechunk(rest)
        return status, rest


def dechunk(b):
    out, i = b"", 0
    while i < len(b):
        j = b.find(b"\r\n", i)
        if j < 0:
            break
        n = int(b[i:j].split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += b[j + 2 : j + 2 + n]
        i = j + 2 + n + 2
    return out


def error_object(body):
    """The `error` object of an OpenAI error body, or None."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(err, dict) and all(k in err for k in ("message", "type", "param", "code")):
        return err
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--hold", type=int, default=0, help="idle connections kept open meanwhile")
    ap.add_argument("--token-id", type=int, default=5, help="a token id below the vocabulary")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    args = ap.parse_args()
    t = Target(args.base_url, args.timeout, args.api_key)
    deadline = time.monotonic() + args.max_seconds
    tid = args.token_id
    good = {"prompt": [tid, tid + 1, tid + 2], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}

    held = []
    if args.hold:
        try:
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = args.hold + 256
            if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ImportError, ValueError, OSError):
            pass
        try:
            for _ in range(args.hold):
                held.append(t.connect())
            report(True, f"hold {args.hold} idle connections")
        except OSError as e:
            report(False, f"hold {args.hold} idle connections", f"{len(held)} opened: {e}")

    def bad(name, method, path, body, want=(400,), param=None, needs_error=True):
        try:
            status, text = t.request(method, path, body)
        except OSError as e:
            report(False, name, f"no answer: {e}")
            return
        if status not in want:
            report(False, name, f"status {status}, want {want}: {text[:160]!r}")
            return
        if needs_error:
            err = error_object(text)
            if err is None:
                report(False, name, f"status {status} without the error object: {text[:160]!r}")
                return
            if param and err["param"] != param and param not in err["message"]:
                report(False, name, f"error names neither `{param}`: {err}")
                return
            report(True, name, f"{status} {err['message'][:90]}")
        else:
            report(True, name, f"{status}")

    def disconnect(name, stream):
        body = json.dumps({**good, "max_tokens": 256, "stream": stream}).encode()
        try:
            s = t.connect()
            s.sendall(t.head("POST", "/v1/completions", len(body)) + body)
            if stream:
                got = b""
                while b"data:" not in got:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                if b"data:" not in got:
                    s.close()
                    report(False, name, f"no first chunk: {got[:160]!r}")
                    return
            s.close()  # before the answer (not streamed) or after the first chunk
            report(True, name)
        except OSError as e:
            report(False, name, f"{e}")

    def good_request(name):
        try:
            status, text = t.request("POST", "/v1/completions", good)
            v = json.loads(text) if status == 200 else None
        except (OSError, ValueError) as e:
            report(False, name, f"{e}")
            return
        n = v and v.get("usage", {}).get("completion_tokens")
        report(status == 200 and n == 4, name, f"status {status}, completion_tokens {n}")

    huge = "b " * 500_000  # 1 MB of text
    rounds = 0
    while rounds < args.rounds and time.monotonic() < deadline:
        rounds += 1
        r = f"[round {rounds}] "
        bad(r + "malformed JSON", "POST", "/v1/completions", b'{"prompt": [1, 2')
        bad(r + "body not UTF-8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}')
        bad(r + "JSON array body", "POST", "/v1/completions", b"[1, 2]")
        bad(r + "max_tokens a string", "POST", "/v1/completions",
            {**good, "max_tokens": "5"}, param="max_tokens")
        bad(r + "temperature a string", "POST", "/v1/completions",
            {**good, "temperature": "hot"}, param="temperature")
        bad(r + "prompt an object", "POST", "/v1/completions",
            {**good, "prompt": {"a": 1}}, param="prompt")
        bad(r + "messages not a list", "POST", "/v1/chat/completions",
            {"messages": "hi", "max_tokens": 4}, param="messages")
        bad(r + "negative max_tokens", "POST", "/v1/completions",
            {**good, "max_tokens": -1}, param="max_tokens")
        bad(r + "huge max_tokens", "POST", "/v1/completions",
            {**good, "max_tokens": 1 << 40}, param="max_tokens")
        bad(r + "token id past the vocabulary", "POST", "/v1/completions",
            {**good, "prompt": [tid, 2147483647]}, param="prompt")
        bad(r + "1 MB prompt", "POST", "/v1/completions", {"prompt": huge, "max_tokens": 4},
            want=(400, 413))
        bad(r + "unknown path", "POST", "/v1/nothing-here", good, want=(404,), needs_error=False)
        bad(r + "wrong method", "GET", "/v1/completions", None, want=(405,), needs_error=False)
        try:
            status, text = t.request("POST", "/v1/completions",
                                     {**good, "some_extension": {"x": [1, 2]}, "user": "u"})
            report(status == 200, r + "unknown fields are ignored", f"status {status}")
        except OSError as e:
            report(False, r + "unknown fields are ignored", f"{e}")
        disconnect(r + "client leaves a stream after its first chunk", True)
        disconnect(r + "client leaves before a non-streamed answer", False)
        good_request(r + "a good request after all that")

    if held:
        good_request(f"a good request while {len(held)} idle connections are open")
        for s in held:
            s.close()
    failed = RESULTS.count(False)
    print(f"summary: {RESULTS.count(True)} passed, {failed} failed, {rounds} rounds", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
