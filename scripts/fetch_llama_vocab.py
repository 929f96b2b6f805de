#!/usr/bin/env python3
"""Fetches llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with their .inp /
.out corpora, ~75 MB) from the llama-cpp-python source distribution on the package index, for
crates/fl-engine/tests/gguf_vocab_llamacpp.rs, and prints the folder (FL_LLAMA_VOCAB_DIR).

    export FL_LLAMA_VOCAB_DIR="$(python3 scripts/fetch_llama_vocab.py)"

Pinned to one release and checked against the index's sha256. Kept under
~/.cache/fasterllama/llama-vocab (a second run only prints the folder). Best effort: without
the index it prints the reason on stderr, nothing on stdout, and exits 1. Standard library only.
"""

import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.request

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
DEST = os.path.join(os.path.expanduser("~"), ".cache", "fasterllama", "llama-vocab")
MARK = "ggml-vocab-llama-spm.gguf.out"


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else DEST
    if os.path.exists(os.path.join(dest, MARK)):
        print(dest)
        return 0
    sdist_name = f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    try:
        # The index's simple API (PEP 691), as pip reads it.
        req = urllib.request.Request(f"https://pypi.org/simple/{PACKAGE}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
        sdist = next(f for f in files if f["filename"] == sdist_name)
        data = urllib.request.urlopen(sdist["url"], timeout=300).read()
    except Exception as e:  # noqa: BLE001 - any network failure means: no corpus here
        print(f"fetch_llama_vocab: {sdist_name} not fetched: {e}", file=sys.stderr)
        return 1
    digest = hashlib.sha256(data).hexdigest()
    if digest != sdist["hashes"]["sha256"]:
        print(f"fetch_llama_vocab: sha256 {digest} != the index's", file=sys.stderr)
        return 1
    os.makedirs(dest, exist_ok=True)
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        for m in t.getmembers():
            name = os.path.basename(m.name)
            if m.isfile() and "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
                with open(os.path.join(dest, name), "wb") as f:
                    f.write(t.extractfile(m).read())
                n += 1
    if not os.path.exists(os.path.join(dest, MARK)):
        print(f"fetch_llama_vocab: no {MARK} in the archive ({n} files)", file=sys.stderr)
        return 1
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
