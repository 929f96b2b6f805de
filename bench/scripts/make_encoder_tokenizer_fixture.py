"""Writes crates/fl-engine/tests/data/encoder/tokenizer/: a tiny BERT-style WordPiece
tokenizer.json (about 60 entries) and encodings.json (not expected.json: the model-fixture
tests take every directory holding one), the ids and token type ids that
transformers' BertTokenizerFast gives for single texts and (query, passage) pairs, with and
without truncation (longest-first for pairs). Run with the `tokenizers` and `transformers`
packages installed: python bench/scripts/make_encoder_tokenizer_fixture.py
"""

import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import BertTokenizerFast

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "fl-engine", "tests", "data", "encoder", "tokenizer"
)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a is of and to in what how why who capital city country france paris germany berlin "
    "river rivers flows through long longest largest small model models embed embedding "
    "search query passage answer question rerank score fast faster cat dog sat on mat , . ?"
).split()
PIECES = ["##s", "##ing", "##er", "##est", "##ed", "##ly", "run", "jump", "bank"]


def main():
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS + PIECES)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "tokenizer.json")
    tok.save(path)

    hf = BertTokenizerFast(tokenizer_file=path)
    texts = [
        "What is the capital of France?",
        "Paris is the capital city of France.",
        "The longest river flows through Germany and France, jumping and running.",
        "Zebras quack loudly",
        "",
        "cat",
    ]
    pairs = [
        ("what is the capital of france?", "Paris is the capital city of France."),
        ("How fast is the model?", "The faster model embeds the query and passage, the largest is small."),
        ("who sat on the mat?", "The cat sat on the mat. The dog sat on the mat. The cat ran."),
        ("the capital of the country of the river that flows through the longest city", "Berlin."),
    ]
    cases = []

    def add(kind, a, b, max_length):
        kw = {"truncation": "longest_first", "max_length": max_length} if max_length else {}
        enc = hf(a, b, **kw) if b is not None else hf(a, **kw)
        cases.append({
            "kind": kind, "text": a, "pair": b, "max_length": max_length,
            "ids": enc["input_ids"], "token_types": enc["token_type_ids"],
        })

    for t in texts:
        add("single", t, None, None)
        add("single", t, None, 8)
    for q, p in pairs:
        add("pair", q, p, None)
        for m in (8, 12, 16):
            add("pair", q, p, m)
    with open(os.path.join(OUT, "encodings.json"), "w") as f:
        json.dump({"vocab_size": len(vocab), "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"{len(vocab)} vocab entries, {len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
