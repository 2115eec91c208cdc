"""Tokenizer: streaming detokenization of multi-byte text, chat templates, empty prompts."""

import random

import pytest

from redrafter_mlx import generate, load, stream
from redrafter_mlx.errors import EmptyPromptError, InvalidPromptError

MULTIBYTE = [
    "naïve café déjà vu, Ålesund — Øre",
    "日本語のテキストと中文字符",
    "🙂🚀 emoji 👩‍💻 with a ZWJ and flags 🇫🇷",
    "mixed: ça va? 你好 🙂 ok",
]


@pytest.fixture(params=["folder", "gguf"])
def tiny_tokenizer(request, tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    if request.param == "folder":
        path = tiny_kit.write_folder(tmp_path / "f", model)
    else:
        path = tiny_kit.write_gguf(tmp_path / "m.gguf", model)
    return load(str(path)).tokenizer


def stream_deltas(tok, ids, chunk_sizes):
    detok = tok.detokenizer()
    deltas, i = [], 0
    for n in chunk_sizes:
        deltas.append(detok.add(ids[i : i + n]))
        i += n
        if i >= len(ids):
            break
    assert i >= len(ids)
    deltas.append(detok.flush())
    return deltas, detok


def check_streaming(tok, text, seed=0):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # The test means something: some tokens hold only part of a character.
    assert any("\ufffd" in tok.decode([i]) for i in ids), "no token splits a character"
    rng = random.Random(seed)
    for sizes in ([1] * len(ids), [rng.randint(0, 3) for _ in range(4 * len(ids))]):
        deltas, detok = stream_deltas(tok, ids, sizes)
        assert "".join(deltas) == text
        assert detok.text == text
        assert not any("\ufffd" in d for d in deltas), deltas


@pytest.mark.parametrize("text", MULTIBYTE)
def test_streaming_deltas_join_to_the_text_without_replacement_chars(tiny_tokenizer, text):
    check_streaming(tiny_tokenizer, text)


def test_streaming_with_the_default_models_tokenizer(default_model):
    for i, text in enumerate(MULTIBYTE):
        check_streaming(default_model.tokenizer, text, seed=i)


def test_detokenizer_skips_special_tokens_and_flushes_incomplete_bytes(tiny_kit, tiny_loaded):
    tok = tiny_loaded.tokenizer
    ids = tok.encode("日本", add_special_tokens=False) + [tiny_kit.token_id("<|im_end|>")]
    deltas, detok = stream_deltas(tok, ids, [1] * len(ids))
    assert "".join(deltas) == "日本"
    # A trailing incomplete character is held back by add(), and flush() drops it (a reply cut inside
    # it showed U+FFFD, and a chat fed that back to the model); what came before it is released.
    partial = tok.encode("日", add_special_tokens=False)[:-1]
    detok = tok.detokenizer()
    assert detok.add(partial) == "" and detok.flush() == ""
    detok = tok.detokenizer()
    assert detok.add(tok.encode("本", add_special_tokens=False) + partial) == "本" and detok.flush() == ""
    assert detok.text == "本"


def test_generation_events_stream_text_safely(tiny_loaded):
    """Whatever bytes a (random) model emits, the events' text deltas join to the decoded tokens,
    less a character the cut at max_tokens left incomplete (this seed's reply ends inside one)."""
    m = tiny_loaded
    events = list(stream(m, "日本 🙂", max_tokens=40, temperature=1.0, seed=3))
    tokens = [t for e in events for t in e.tokens]
    assert len(tokens) == 40
    decoded = m.tokenizer.decode(tokens, skip_special_tokens=True)
    assert decoded.endswith("\ufffd")
    assert "".join(e.text for e in events) == decoded.rstrip("\ufffd")


# ---- chat template -----------------------------------------------------------------------

def test_chat_template_multi_turn(tiny_kit, tiny_loaded):
    tok = tiny_loaded.tokenizer
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 🙂"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again?"}]
    want = ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi 🙂<|im_end|>\n"
            "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.prompt_ids(msgs)
    assert tok.decode(ids) == want
    assert ids.count(tiny_kit.token_id("<|im_start|>")) == 5  # special tokens are single ids
    assert ids.count(tiny_kit.token_id("<|im_end|>")) == 4
    assert ids == tok.hf.encode(want, add_special_tokens=False)
    # A str prompt is one user message; system= puts a system message first.
    assert tok.decode(tok.prompt_ids("hi 🙂")) == "<|im_start|>user\nhi 🙂<|im_end|>\n<|im_start|>assistant\n"
    assert tok.prompt_ids("again?", system="be brief") == tok.prompt_ids(msgs[:1] + msgs[3:])
    # A blank system prompt is no system prompt, as an empty one is ("  " put a blank system message first).
    for blank in ("", "  ", "\n"):
        assert tok.prompt_ids("again?", system=blank) == tok.prompt_ids("again?")
    # Token ids pass through as they are.
    assert tok.prompt_ids([5, 6, 7]) == [5, 6, 7]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == tok.hf.encode(
        want[: -len("<|im_start|>assistant\n")], add_special_tokens=False)


def test_multi_turn_generation_uses_the_template(tiny_loaded):
    m = tiny_loaded
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"}]
    g = generate(m, msgs, max_tokens=3)
    assert g.prompt_tokens == m.tokenizer.prompt_ids(msgs)
    assert g.prompt_tokens == generate(m, list(g.prompt_tokens), max_tokens=3).prompt_tokens
    assert generate(m, list(g.prompt_tokens), max_tokens=3).tokens == g.tokens


def test_default_model_chat_template(default_model):
    tok = default_model.tokenizer
    msgs = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"}]
    text = tok.decode(tok.prompt_ids(msgs))
    order = [text.index(s) for s in ("<|im_start|>user\nName a color.<|im_end|>",
                                     "<|im_start|>assistant\nBlue.<|im_end|>",
                                     "<|im_start|>user\nAnother one?<|im_end|>")]
    assert order == sorted(order) and text.endswith("<|im_start|>assistant\n")


def test_model_without_chat_template(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    cfg = path / "tokenizer_config.json"
    import json

    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tok = load(str(path)).tokenizer
    assert not tok.has_chat_template
    msgs = [{"role": "user", "content": "hi"}, {"role": "user", "content": "there"}]
    assert tok.decode(tok.prompt_ids(msgs)) == "hi\nthere"


def test_a_chat_template_that_refuses_a_conversation_says_so(tiny_kit, tmp_path, capsys):
    """Mistral v0.1's template raises on a system message (a jinja2 TemplateError and traceback)."""
    import json

    from redrafter_mlx.__main__ import main as cli
    from redrafter_mlx.errors import InvalidPromptError

    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    refuses = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               "{% endif %}{{ m['content'] }}{% endfor %}")
    cfg = path / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": refuses}))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    m = load(str(path), use_drafter=False)
    with pytest.raises(InvalidPromptError, match="chat template refused this conversation: Conversation roles"):
        generate(m, "hi", system="Be brief.")
    assert generate(m, "hi", max_tokens=2, mode="ar").tokens  # a conversation it takes
    assert cli(["--model", str(path), "--system", "Be brief.", "hi"]) == 2
    err = capsys.readouterr().err
    assert "chat template refused" in err and "Traceback" not in err


# ---- empty prompts -----------------------------------------------------------------------

@pytest.mark.parametrize("prompt", ["", "   \n\t", [], [{"role": "user", "content": "  "}],
                                    [{"role": "system", "content": ""}, {"role": "user", "content": "\n"}],
                                    # invisible: a zero-width space, a word joiner, a byte-order mark, a NUL
                                    "\u200b", " \u2060\ufeff\n\u200d ", "\x00",
                                    [{"role": "user", "content": "\u200b"}]])
def test_empty_prompt_is_refused(tiny_loaded, prompt):
    m = tiny_loaded
    with pytest.raises(EmptyPromptError, match="empty|no text"):
        m.tokenizer.prompt_ids(prompt)
    with pytest.raises(EmptyPromptError):
        generate(m, prompt)
    with pytest.raises(EmptyPromptError):
        next(stream(m, prompt))


def test_an_invisible_system_prompt_is_no_system_prompt(tiny_loaded):
    """A blank system prompt leaves the template's own default; one of a zero-width space alone is blank."""
    tok = tiny_loaded.tokenizer
    assert tok.prompt_ids("hi", system="\u200b ") == tok.prompt_ids("hi")
    assert tok.prompt_ids("hi\u200b") != tok.prompt_ids("hi")  # visible text around one is kept as it is


def test_a_system_prompt_goes_before_messages_too(tiny_loaded):
    """system= was ignored with a message list, so the chat's --system (which sends the conversation as
    messages) did nothing; with a system message of its own, or with token ids, it is refused."""
    tok = tiny_loaded.tokenizer
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again?"}]
    with_system = tok.prompt_ids([{"role": "system", "content": "be brief"}] + chat)
    assert tok.prompt_ids(chat, system="be brief") == with_system != tok.prompt_ids(chat)
    assert tok.prompt_ids(chat, system="\u200b ") == tok.prompt_ids(chat)  # blank: no system prompt
    with pytest.raises(InvalidPromptError, match="starts with a system message and a system prompt is given too"):
        tok.prompt_ids([{"role": "system", "content": "x"}] + chat, system="be brief")
    with pytest.raises(InvalidPromptError, match="not token ids"):
        tok.prompt_ids([1, 2, 3], system="be brief")
    assert tok.prompt_ids([1, 2, 3], system="") == [1, 2, 3]
