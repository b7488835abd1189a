"""The storable-text rule (distsched_app.text): refuse on the way in, escape on the way out."""

from __future__ import annotations

import json
import os

import pytest

from distsched_app import text

SURROGATE = os.fsdecode(b"caf\xe9")  # what an undecodable byte in a file name or argv becomes
assert SURROGATE == "caf\udce9"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("plain", None),
        ("émoji 😀 and ünïcode", None),
        ("a\\u0000 written out", None),
        ("nul\x00inside", "a NUL character (\\u0000) at position 3"),
        (SURROGATE, "a lone surrogate (\\udce9) at position 3"),
        ("\ud83d\ude00", "a lone surrogate (\\ud83d) at position 0"),  # a pair of code points is still two
    ],
)
def test_unstorable_names_the_first_bad_character(value, problem):
    assert text.unstorable(value) == problem


def test_unstorable_in_walks_strings_and_keys_of_decoded_json():
    assert text.unstorable_in({"ok": [1, "two", {"three": None}]}) is None
    assert "NUL" in text.unstorable_in({"ok": [1, {"k\x00": 2}]})
    assert "surrogate" in text.unstorable_in([[[["deep", SURROGATE]]]])


def test_unstorable_in_is_iterative():
    value: list = ["x\x00"]
    for _ in range(50_000):
        value = [value]
    assert "NUL" in text.unstorable_in(value)


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("plain", "plain"),
        ("nul\x00inside", "nul\\x00inside"),
        (SURROGATE, "caf\\udce9"),
    ],
)
def test_storable_escapes_and_the_result_encodes(value, stored):
    assert text.storable(value) == stored
    stored.encode("utf-8")  # cannot raise


def test_storable_cuts_the_head_or_keeps_head_and_tail():
    long = "head-" + "x" * 5000 + "-tail"
    assert text.storable(long, 100) == long[:100]
    kept = text.storable(long, 200, keep_tail=True)
    assert len(kept) <= 200 and kept.startswith("head-") and kept.endswith("-tail")
    assert "characters truncated" in kept


def test_storable_escapes_before_cutting_so_the_limit_holds():
    assert len(text.storable("\x00" * 100, 50)) == 50


def test_clean_json_copies_with_every_string_and_key_storable():
    value = {"k\x00": [SURROGATE, 1, None, {"n": "ok"}]}
    cleaned = text.clean_json(value)
    assert cleaned == {"k\\x00": ["caf\\udce9", 1, None, {"n": "ok"}]}
    assert value == {"k\x00": [SURROGATE, 1, None, {"n": "ok"}]}  # the input is unchanged
    json.dumps(cleaned, ensure_ascii=False).encode("utf-8")


def test_the_json_column_decoder_escapes_rows_written_before_the_rule():
    stored = json.dumps({"k": ["\ud800", "fine"], "n\u0000": 1})  # what SQLite keeps for such a row
    assert json.loads(stored, cls=text.StorableJSONDecoder) == {"k": ["\\ud800", "fine"], "n\\x00": 1}
    assert json.loads('{"a": "\\\\ud800 is just text"}', cls=text.StorableJSONDecoder) == {"a": "\\ud800 is just text"}
    assert json.loads('[1, "é", {"x": null}]', cls=text.StorableJSONDecoder) == [1, "é", {"x": None}]


class Exploding:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (None, None),
        ({"ok": [1, "two", None]}, {"ok": [1, "two", None]}),
        ("\\u0000 as text", "\\u0000 as text"),
        ({"text": "nul\x00inside"}, {"repr": "{'text': 'nul\\x00inside'}"}),
        ([SURROGATE], {"repr": "['caf\\udce9']"}),
        ({SURROGATE: 1}, {"repr": "{'caf\\udce9': 1}"}),
        (float("inf"), {"repr": "inf"}),
        ({1, 2}, {"repr": "{1, 2}"}),
        (Exploding(), {"repr": "<unrepresentable Exploding>"}),
    ],
    ids=["none", "json", "escaped-text", "nul", "surrogate", "surrogate-key", "inf", "set", "no-repr"],
)
def test_storable_json_never_raises_and_stores_what_it_can(value, stored):
    result = text.storable_json(value, max_bytes=1000)
    assert result == stored
    json.dumps(result, ensure_ascii=False).encode("utf-8")


def test_storable_json_truncates_by_encoded_bytes():
    assert text.storable_json(["é" * 60], max_bytes=100) == {"truncated": json.dumps(["é" * 60], ensure_ascii=False)}
    assert text.storable_json(["e" * 60], max_bytes=100) == ["e" * 60]
