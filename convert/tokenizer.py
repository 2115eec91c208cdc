"""Tokenizer and chat template out: tokenizer.json + tokenizer_config.json (with chat_template).

The files are written by transformers' own `save_pretrained` (legacy layout: the chat
template inside tokenizer_config.json rather than a separate .jinja file, which every
transformers / mlx-lm version reads), so the output folder loads the same tokenizer in
redrafter_mlx and in mlx-lm. A GGUF tokenizer goes through the tokenizer the library builds
from the GGUF metadata; a GGUF that asks for a BOS token gets it from a post-processor, as
Hugging Face folders do.

Checkpoints without a chat template (Vicuna, base Llama) can be given one: a built-in name
(`vicuna`) or a Jinja file.
"""

import json
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional

from redrafter_mlx.errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError, one_line
from redrafter_mlx.files import read_json_object, read_text_file, refuse_lfs_pointer

from .output import ConversionError

# FastChat's "vicuna_v1.1" conversation format (Vicuna v1.1 / v1.3 / v1.5; the base model of
# Apple's published ReDrafter heads).
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
VICUNA_TEMPLATE = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set messages = messages[1:] %}"
    "{% else %}{% set system = '" + VICUNA_SYSTEM.replace("'", "\\'") + "' %}{% endif %}"
    "{{ bos_token }}{{ system }} "
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}USER: {{ m['content'] }} "
    "{% elif m['role'] == 'assistant' %}ASSISTANT: {{ m['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
BUILTIN_TEMPLATES = {"vicuna": VICUNA_TEMPLATE}

# Files a Hugging Face tokenizer may be read from (recorded in the manifest).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "vocab.json", "merges.txt")


def read_chat_template(spec: Optional[str]) -> Optional[str]:
    """A built-in template name or a path to a Jinja file -> the template text."""
    if not spec:
        return None
    if spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec]
    choices = f"give a Jinja file or a built-in template ({', '.join(BUILTIN_TEMPLATES)})"
    text = read_text_file(Path(spec).expanduser(), "chat template", choices, error=ConversionError)
    if not text.strip():  # ("" replaced the checkpoint's template: chat messages went to the model as bare text)
        raise ConversionError(f"--chat-template {spec} is empty: give a Jinja file that holds the template "
                              f"(or {', '.join(BUILTIN_TEMPLATES)}; leave the option out to keep the checkpoint's own)")
    if text.lstrip().startswith("{"):
        try:  # (a tokenizer_config.json, where many models keep theirs, became the template: JSON text each prompt)
            document = json.loads(text)
        except ValueError:
            document = None
        if isinstance(document, dict):
            raise ConversionError(f"--chat-template {spec} is a JSON file, not a Jinja template: give the template "
                                  f"itself (jq -r .chat_template {shlex.quote(spec)} > chat_template.jinja)")
    import jinja2

    try:  # as transformers compiles it (with loop controls), so a broken template fails here, not in every chat
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConversionError(f"--chat-template {spec}: not a valid Jinja template (line {e.lineno}: {e.message})") from None
    return text


def _save(hf, dest: Path, chat_template: Optional[str]):
    if chat_template is not None:
        hf.chat_template = chat_template
    hf.save_pretrained(str(dest), save_jinja_files=False)
    # Transformers 5 names its generic fast tokenizer "TokenizersBackend", a class 4.x lacks;
    # "PreTrainedTokenizerFast" means the same to both.
    path = dest / "tokenizer_config.json"
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _config_fails_alike(src: Path, error: Exception) -> bool:
    """Did the tokenizer fail on config.json? A field of the wrong type (hidden_size "64") said "cannot load the
    tokenizer in ...: Validation error for field 'hidden_size':", blaming the tokenizer and cutting off the why."""
    from transformers import AutoConfig

    if not (src / "config.json").is_file():
        return False
    try:
        AutoConfig.from_pretrained(str(src), trust_remote_code=False)
    except Exception as e:
        return type(e) is type(error) and str(e) == str(error)
    return False


def _tokenizer_code(src: Path) -> Optional[str]:
    """The checkpoint's own tokenizer class its tokenizer_config.json's auto_map names, if any."""
    auto = read_json_object(src / "tokenizer_config.json", "tokenizer file").get("auto_map") \
        if (src / "tokenizer_config.json").is_file() else None
    names = auto.get("AutoTokenizer") if isinstance(auto, dict) else None
    names = [names] if isinstance(names, str) else names if isinstance(names, list) else []
    return next((n for n in names if isinstance(n, str) and n), None)


def save_hf_tokenizer(src: Path, dest: Path, chat_template: Optional[str] = None,
                      vocab_size: Optional[int] = None) -> Dict[str, Any]:
    """Copy a Hugging Face folder's tokenizer (never running code from it); "past" lists its tokens whose ids are
    `vocab_size` or more (past the model's embedding table)."""
    from transformers import AutoTokenizer

    files = [src / n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not any(f.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for f in files):
        raise ModelNotFoundError(f"{src} has no tokenizer (expected tokenizer.json or tokenizer.model)")
    for f in files:
        refuse_lfs_pointer(f)
        if f.suffix == ".json":  # transformers' JSON error named no file ("cannot load the tokenizer in X: Expecting
            read_json_object(f, "tokenizer file")  # value: line 1 column 1 (char 0)"): a damaged one is named
    try:
        hf = AutoTokenizer.from_pretrained(str(src), trust_remote_code=False)
    except Exception as e:
        if _config_fails_alike(src, e):  # transformers reads config.json to choose the tokenizer class
            raise CorruptModelError(f"{src / 'config.json'} does not pass transformers' checks: {one_line(e)}") from e
        code = _tokenizer_code(src)
        if code is not None and "trust_remote_code" in str(e):  # ("contains custom code which must be executed")
            raise UnsupportedModelError(f"{src / 'tokenizer_config.json'}: its auto_map asks to build the tokenizer "
                                        f"by running {code!r} from the checkpoint, which this converter never "
                                        "does") from e
        text = str(e).strip().splitlines()
        raise CorruptModelError(f"cannot load the tokenizer in {src}: {text[0] if text else type(e).__name__}") from e
    _save(hf, dest, chat_template)
    past = [] if vocab_size is None else [t for t, i in sorted(hf.get_vocab().items(), key=lambda x: x[1])
                                          if i >= vocab_size]
    return {"chat_template": bool(hf.chat_template), "files": files, "size": len(hf), "past": past}


def save_gguf_tokenizer(meta: Dict[str, Any], dest: Path, chat_template: Optional[str] = None) -> Dict[str, Any]:
    """Write the tokenizer stored in a GGUF file's metadata; returns bos/eos ids for generation_config."""
    from tokenizers import processors

    from redrafter_mlx.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(meta)
    hf = tok.hf
    if tok.add_bos and tok.bos_token_id is not None:
        bos = hf.bos_token
        hf.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tok.bos_token_id)]
        )
    _save(hf, dest, chat_template)
    return {
        "chat_template": bool(hf.chat_template),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": list(tok.eos_token_ids),
    }


def write_generation_config(dest: Path, bos: Optional[int], eos: List[int]):
    """generation_config.json with the stop tokens (both loaders read eos_token_id from it)."""
    config = {"bos_token_id": bos, "eos_token_id": eos[0] if len(eos) == 1 else eos}
    (dest / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
