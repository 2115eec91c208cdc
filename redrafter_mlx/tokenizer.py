"""Tokenizer: encode/decode, chat template, stop tokens, incremental detokenization.

Two sources, one class:
- a Hugging Face / MLX model folder: `transformers.AutoTokenizer` (tokenizer.json etc.);
- a GGUF file: the BPE vocabulary, merges, special tokens and chat template stored in its
  metadata, assembled with the `tokenizers` library and wrapped in transformers' fast
  tokenizer so both sources render chat templates the same (Jinja, as transformers does).

`Detokenizer` turns a growing list of ids into text deltas without ever emitting half a
multi-byte character (the windowed-decode scheme used by TGI and vLLM).
"""

import json
import numbers
import os
import unicodedata
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner

from .errors import (CorruptModelError, EmptyPromptError, InvalidPromptError, UnsupportedModelError,  # noqa: E402
                     compact, one_line)
from .files import read_json_object, refuse_lfs_pointer  # noqa: E402


def is_blank(text: str) -> bool:
    """Whether text shows nothing: whitespace and invisible format or control characters alone (a
    zero-width space U+200B, a joiner, a byte-order mark: Unicode categories Cf and Cc). A prompt of
    U+200B alone passed the check for an empty one (str.strip keeps it) and was answered."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc") for ch in text)


def is_token_id(value) -> bool:
    """A whole number >= 0 (bools, floats such as 2.5 and negative numbers are not): what a
    prompt, a results file or a config may hold where a token id belongs."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def first_non_id(values) -> Optional[int]:
    """The index of the first element that is not a token id (`is_token_id`), None where all are: by position,
    since an element None read as "none bad" when the element itself was returned."""
    return next((i for i, t in enumerate(values) if not is_token_id(t)), None)


# Pre-tokenizer per GGUF `tokenizer.ggml.pre`, as llama.cpp defines them.
# "digits" = split every digit on its own before the GPT-2 byte-level regex.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRETOKENIZERS = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama3": "llama3",
    "llama-bpe": "llama3",
    "llama-v3": "llama3",
    "smaug-bpe": "llama3",
}

# Tokens that end an assistant turn in common chat templates, used as extra stop tokens
# when they are special tokens of the vocabulary.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")

Messages = List[Dict[str, str]]
# The roles of Hugging Face's chat format, what chat templates render (a tool's result included). Any
# other went into the template as it was: ChatML's wrote "<|im_start|>bogus" and the model replied to it.
ROLES = ("system", "user", "assistant", "tool")


def check_gguf_tokenizer(meta: Dict[str, Any]) -> str:
    """Raise unless the GGUF metadata holds a tokenizer this module builds; return its pre-tokenizer
    kind. read_gguf asks before it reads the tensors (an 8B file's take a while)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:  # it said "tokenizer model None is not supported"
        raise CorruptModelError("the GGUF holds no tokenizer (no tokenizer.ggml.model and tokenizer.ggml.tokens in its "
                                "metadata): use a GGUF written with its tokenizer, or the model's Hugging Face folder")
    if model != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2'); "
            "convert the model to a Hugging Face folder with its tokenizer.json instead"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not merges:  # it loaded, and every text reached the model byte by byte
        raise CorruptModelError("the GGUF's byte-level BPE tokenizer has no merges (tokenizer.ggml.merges missing or "
                                "empty): text would reach the model byte by byte, not as its tokens; use a GGUF "
                                "written with its whole tokenizer, or the model's Hugging Face folder")
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    kind = GGUF_PRETOKENIZERS.get(pre)
    if kind is None:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(sorted(GGUF_PRETOKENIZERS))})"
        )
    return kind


def _gguf_tokenizer_object(meta: Dict[str, Any]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind = check_gguf_tokenizer(meta)
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CorruptModelError("GGUF tokenizer has duplicate tokens")
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=(kind == "llama3")))
    except Exception as e:  # tokenizers raises a bare Exception ("Token `zzz` out of vocabulary"): it was a traceback
        raise CorruptModelError(f"the GGUF's tokenizer cannot be built from its tokens and merges: {one_line(e)}") from e
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(kind != "llama3"))
    if kind == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif kind == "llama3":
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    # token_type 3 = control, 4 = user-defined: matched whole, never split by BPE.
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if hasattr(types, "tolist") else list(types or [])
    special = [AddedToken(tokens[i], special=(t == 3), normalized=False) for i, t in enumerate(types) if t in (3, 4)]
    tok.add_special_tokens([t for t in special if t.special])
    tok.add_tokens([t for t in special if not t.special])
    return tok, tokens


def _tiktoken_file(path: Path) -> bool:
    """Whether a file starts as a tiktoken BPE file does: a line of a base64 token and its rank."""
    import re

    try:
        with open(path, "rb") as f:
            first = f.read(512).split(b"\n", 1)[0].strip()
    except OSError:
        return True  # (unreadable: the error said is the reader's)
    return re.fullmatch(rb"[A-Za-z0-9+/]+=* \d+", first) is not None


def _check_text(text, what: str):
    """Text the tokenizer can take: a str with no lone surrogates (what Python makes of bytes that are
    not UTF-8 in a command-line argument or standard input; the tokenizer failed on them with a TypeError)."""
    if not isinstance(text, str):
        raise InvalidPromptError(f"{what} is not text but {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidPromptError(f"{what} is not valid text: {e.reason} at character {e.start} (bytes that are not "
                                 "UTF-8?)") from None


class Tokenizer:
    """Thin wrapper over a transformers fast tokenizer with what generation needs."""

    def __init__(self, hf_tokenizer, eos_token_ids: Iterable[int], add_bos: bool = False):
        self.hf = hf_tokenizer
        self.eos_token_ids = sorted(set(int(i) for i in eos_token_ids))
        self.add_bos = add_bos
        self.bos_token_id = hf_tokenizer.bos_token_id
        self.vocab_size = len(hf_tokenizer)

    # ----- construction -------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: Dict[str, Any]) -> "Tokenizer":
        from transformers import PreTrainedTokenizerFast

        tok, tokens = _gguf_tokenizer_object(meta)

        def token_of(key):
            v = meta.get(key)
            if v is None:
                return None
            v = int(v.item() if hasattr(v, "item") else v)
            return tokens[v] if 0 <= v < len(tokens) else None

        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token=token_of("tokenizer.ggml.bos_token_id"),
            eos_token=token_of("tokenizer.ggml.eos_token_id"),
            unk_token=token_of("tokenizer.ggml.unknown_token_id"),
            pad_token=token_of("tokenizer.ggml.padding_token_id"),
        )
        template = meta.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):  # an array failed at the first prompt
            raise CorruptModelError(f"the GGUF's tokenizer.chat_template is not text but {type(template).__name__}")
        hf.chat_template = template
        eos = {hf.convert_tokens_to_ids(t) for t in (token_of("tokenizer.ggml.eos_token_id"), token_of("tokenizer.ggml.eot_token_id")) if t}
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        add_bos = bool(add_bos.item() if hasattr(add_bos, "item") else add_bos) if add_bos is not None else False
        return cls(hf, eos | cls._end_of_turn_ids(hf), add_bos=add_bos)

    @classmethod
    def from_folder(cls, path, eos_token_ids: Sequence[int] = ()) -> "Tokenizer":
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except Exception as e:
            files = [n for n in ("tokenizer.json", "tokenizer.model", "vocab.json") if (Path(path) / n).is_file()]
            for name in files + ["tokenizer_config.json"]:  # it said "Expecting value: line 1 column 1 (char 0)"
                refuse_lfs_pointer(Path(path) / name)
            if isinstance(e, ValueError):  # a damaged JSON file was said in the parser's words, naming none
                for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                             "vocab.json"):
                    if (Path(path) / name).is_file():
                        try:
                            json.loads((Path(path) / name).read_text(encoding="utf-8"))
                        except ValueError as bad:
                            raise CorruptModelError(f"cannot load the tokenizer: {Path(path) / name} is not valid JSON "
                                                    f"({one_line(bad)}): copy it again from the model") from e
            if not files:
                raise CorruptModelError(f"{path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): "
                                        "copy the tokenizer files of the model into it") from e
            sp = Path(path) / "tokenizer.model"
            if "tiktoken" in str(e) and sp.is_file() and not _tiktoken_file(sp):
                # transformers falls back to reading a damaged SentencePiece model as tiktoken's, and said to install
                # tiktoken, which does not read it either
                raise CorruptModelError(f"cannot load the tokenizer in {path}: its tokenizer.model is neither a "
                                        "SentencePiece model nor a tiktoken file (damaged?): copy it again from the "
                                        "model") from e
            raise CorruptModelError(f"cannot load the tokenizer in {path}: {one_line(e)}") from e
        if len(hf) <= len(set(hf.all_special_ids)):
            # transformers builds a tokenizer of its special tokens alone for a folder without tokenizer files when
            # config.json names qwen2, gemma, gpt2, ...: the load went on and every prompt read as empty
            files = [n for n in ("tokenizer.json", "tokenizer.model", "vocab.json") if (Path(path) / n).is_file()]
            raise CorruptModelError(
                f"{path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): copy the tokenizer files "
                "of the model into it" if not files else
                f"the tokenizer in {path} ({', '.join(files)}) holds special tokens only, no vocabulary: copy the "
                "tokenizer files of the model again")
        extra = Path(path) / "chat_template.json"  # a processor's file (vision-language releases): transformers'
        if not getattr(hf, "chat_template", None) and extra.is_file():  # tokenizer reads only chat_template.jinja
            template = read_json_object(extra, "chat template file").get("chat_template")
            if not isinstance(template, str):  # (without it, the chat ran as plain text, saying nothing of the file)
                raise CorruptModelError(f"{extra} holds no chat_template text")
            hf.chat_template = template
            source = extra
        elif isinstance(getattr(hf, "chat_template", None), dict):  # named ones (additional_chat_templates/)
            source = Path(path)
        else:  # transformers reads chat_template.jinja before the chat_template in tokenizer_config.json
            source = next((Path(path) / n for n in ("chat_template.jinja", "tokenizer_config.json")
                           if (Path(path) / n).is_file()), Path(path) / "tokenizer_config.json")
        eos = set(eos_token_ids)
        if hf.eos_token_id is not None:
            eos.add(hf.eos_token_id)
        # Folders that carry their own BOS in the post-processor need nothing more.
        tokenizer = cls(hf, eos | cls._end_of_turn_ids(hf), add_bos=False)
        tokenizer.check_chat_template(f"the chat template in {source}")
        return tokenizer

    def check_chat_template(self, where: str):
        """Compile the chat template as transformers does at the first prompt (its own Jinja environment and
        extensions), so a template that is not valid Jinja is refused at load, as a CorruptModelError naming
        `where` and the line, not at the first prompt of a chat."""
        template = getattr(self.hf, "chat_template", None)
        if not template:
            return
        try:
            from jinja2 import TemplateSyntaxError
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:  # (transformers' helper moved: the first prompt says it, as before)
            return
        named = template.items() if isinstance(template, dict) else [(None, template)]
        for name, text in named:
            what = f"{where} (the one named {name!r})" if name is not None else where
            if not isinstance(text, str):
                raise CorruptModelError(f"{what} is not text but {type(text).__name__}")
            try:
                _compile_jinja_template(text)
            except TemplateSyntaxError as e:  # (TemplateAssertionError too: a filter Jinja does not have)
                raise CorruptModelError(f"{what} is not valid Jinja (line {e.lineno}: {one_line(e.message or e)}): "
                                        "fix it, or copy it again from the model") from e
            except SyntaxError as e:  # Jinja's Python, e.g. {% break %} outside a loop
                raise CorruptModelError(f"{what} is not valid Jinja ({one_line(e.msg or e)}): fix it, or copy it again "
                                        "from the model") from e

    @staticmethod
    def _end_of_turn_ids(hf) -> set:
        specials = set(hf.all_special_tokens) | {str(t) for t in getattr(hf, "added_tokens_decoder", {}).values() if getattr(t, "special", False)}
        return {hf.convert_tokens_to_ids(t) for t in END_OF_TURN_TOKENS if t in specials}

    # ----- encoding -----------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        ids = self.hf.encode(text, add_special_tokens=add_special_tokens)
        if add_special_tokens and self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> List[int]:
        """Render messages with the model's own chat template and tokenize (no extra BOS)."""
        if not self.has_chat_template:
            # A model without a template: plain concatenation of the contents.
            return self.encode("\n".join(m["content"] for m in messages))
        from jinja2 import TemplateError, TemplateSyntaxError

        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        except TemplateSyntaxError as e:  # the model's files, not the conversation: it said the template "refused" it
            raise CorruptModelError(f"the model's chat template is not valid Jinja (line {e.lineno}: {one_line(e)}): "
                                    "fix chat_template in its tokenizer files") from e
        except TemplateError as e:  # e.g. Mistral's template raises on a system message or two user turns in a row
            raise InvalidPromptError(f"the model's chat template refused this conversation: {one_line(e)}") from e
        return self.hf.encode(text, add_special_tokens=False)

    def prompt_ids(self, prompt: Union[str, Messages, Sequence[int]], system: Optional[str] = None) -> List[int]:
        """Token ids for a prompt: a user message (str), a message list, or ids as they are (whole
        numbers >= 0; `generate.stream` checks them against the model's vocabulary). `system` (blank:
        none, the template's default) is a system message put first, before text or a message list
        that has none of its own."""
        if system is not None:
            _check_text(system, "the system prompt")
        # a blank system prompt is no system prompt ("" kept the template's default, "  " replaced it)
        system = None if system is None or is_blank(system) else system
        if isinstance(prompt, str):
            _check_text(prompt, "the prompt")
            if is_blank(prompt):
                raise EmptyPromptError("the prompt is empty")
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": prompt}]
            ids = self.apply_chat_template(messages)
        elif isinstance(prompt, (bytes, bytearray, memoryview)):  # a Sequence of ints, which read as token ids
            raise InvalidPromptError("a prompt is text, not bytes: decode it first (e.g. .decode('utf-8'))")
        elif isinstance(prompt, dict):  # one message: what it is not was said, not what to do
            raise InvalidPromptError("a prompt is text, a list of messages or a list of token ids, not one message "
                                     "(dict): put it in a list, [{'role': 'user', 'content': ...}]")
        elif (not isinstance(prompt, Sequence) and not hasattr(prompt, "tolist")) or getattr(prompt, "ndim", 1) == 0:
            # (a numpy or MLX scalar, np.int64(5) or mx.array(5), has a tolist and no len(): a TypeError traceback)
            one = ": one token id is a list of one, [id]" if isinstance(prompt, numbers.Integral) or (
                getattr(prompt, "ndim", 1) == 0 and "int" in str(getattr(prompt, "dtype", ""))) else ""
            raise InvalidPromptError("a prompt is text, a list of messages ({'role': ..., 'content': ...}) or a list of "
                                     f"token ids, not {type(prompt).__name__}{one}")
        elif len(prompt) and isinstance(prompt[0], str):
            raise InvalidPromptError("a prompt list holds messages ({'role': ..., 'content': ...}) or token ids, not "
                                     "strings: pass the text as one string, or each turn as a message")
        elif len(prompt) and (isinstance(prompt[0], dict) or
                              (isinstance(prompt, list) and any(isinstance(m, dict) for m in prompt))):
            for i, m in enumerate(prompt):  # ([5, {...}] was read as token ids, "not {'role': ...}")
                if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                    raise InvalidPromptError(f"message {i} of the conversation is not {{'role': str, 'content': str}}: "
                                             f"{m!r:.80}")
                if m["role"] not in ROLES:
                    raise InvalidPromptError(f"message {i} of the conversation has the role {m['role']!r:.40}: a role is "
                                             f"one of {', '.join(ROLES)}")
                _check_text(m["content"], f"message {i} of the conversation")
            if all(is_blank(m["content"]) for m in prompt):
                raise EmptyPromptError("the conversation has no text")
            messages = list(prompt)
            if system is not None:  # it was ignored: the chat's --system did nothing
                if messages[0]["role"] == "system":
                    raise InvalidPromptError("the conversation starts with a system message and a system prompt is "
                                             "given too: give one of them")
                messages.insert(0, {"role": "system", "content": system})
            ids = self.apply_chat_template(messages)
        else:
            if system is not None:
                raise InvalidPromptError("a system prompt goes with text or messages, not token ids: put it in the "
                                         "ids (the chat template's system turn)")
            ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
            where = first_non_id(ids)
            bad = ids[where] if where is not None else None
            if isinstance(bad, (list, tuple)) and any(isinstance(x, str) for x in bad):
                # (role, content) pairs, as LangChain or a Gradio history holds turns: it said "pass ids[0]"
                raise InvalidPromptError(f"a message is a dict {{'role': ..., 'content': ...}}, not a pair: "
                                         f"{bad!r:.40} (pass [{{'role': r, 'content': c}} for r, c in pairs])")
            if isinstance(bad, (list, tuple)):  # a (1, T) batch, as a tokenizer returns with return_tensors
                raise InvalidPromptError(f"token ids are one flat list (one sequence), not a list of lists: {bad!r:.40} "
                                         "is one element (pass ids[0] for a batch of one)")
            if where is not None:
                raise InvalidPromptError("token ids are whole numbers from 0 to the vocabulary's size - 1, "
                                         f"not {compact(bad, repr)}")
            ids = [int(t) for t in ids]
        if not ids:
            raise EmptyPromptError("the prompt is empty")
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(self) -> "Detokenizer":
        return Detokenizer(self)


class Detokenizer:
    """Incremental detokenization: `add(ids) -> new text` that is safe for multi-byte text.

    Decodes a small window of recent tokens; text is released only once it no longer ends
    in U+FFFD (an incomplete UTF-8 sequence). Special tokens (e.g. EOS) are not rendered.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokens: List[int] = []
        self.text = ""
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens whose text has been released

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            self.tokens.append(int(i))
            prefix_text = self._decode(self.tokens[self._prefix : self._read])
            full_text = self._decode(self.tokens[self._prefix :])
            if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
                delta = full_text[len(prefix_text) :]
                out.append(delta)
                self._prefix, self._read = self._read, len(self.tokens)
        delta = "".join(out)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Release whatever is left, less a trailing incomplete character: a reply cut inside one (by
        max_tokens, a cancel, the context's end) kept U+FFFD, which a chat then fed back to the model as
        text it never wrote. Its bytes stay in `tokens`. (A real U+FFFD at the very end goes too.)"""
        full_text = self._decode(self.tokens[self._prefix :]).rstrip("\ufffd")
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        delta = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        self._prefix = self._read = len(self.tokens)
        self.text += delta
        return delta
