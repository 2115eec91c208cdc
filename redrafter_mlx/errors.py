"""Exceptions raised for user errors. Each message is one readable line."""

import math


def one_line(e: BaseException, limit: int = 240) -> str:
    """Another library's exception text as one line of at most `limit` characters, for a message."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compact(value, as_text=str) -> str:
    """A value a message echoes back, as `as_text` (str or repr) writes it, but an int of more than 20 digits
    in 3 significant digits (-10**50: -1e+50; 4 * 10**70 - 4: 4e+70): such ints were printed whole, 50 to 140
    digits of them in one message, and one past 4300 digits raised Python's ValueError in place of the message.
    (2**64, a seed's bound plus one, has 20: it is still written out.)"""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        log = math.log10(abs(value))  # (exact enough for any int: CPython takes the log of its top bits)
        exponent = math.floor(log)
        mantissa = round(10 ** (log - exponent), 2)
        if mantissa >= 10:  # 10**70's log may fall just short of 70
            mantissa, exponent = mantissa / 10, exponent + 1
        return f"{'-' if value < 0 else ''}{mantissa:g}e+{exponent}"
    return as_text(value)


def compact_digits(negative: bool, digits: str) -> str:
    """`compact` of the int that `digits` (decimal, no leading zeros) and its sign write, read from the text:
    one past Python's int digits (4300, sys.set_int_max_str_digits) cannot be made an int to give it."""
    if len(digits) <= 20:
        return ("-" if negative else "") + digits
    log = math.log10(int(digits[:17])) + len(digits) - 17
    exponent = math.floor(log)
    mantissa = round(10 ** (log - exponent), 2)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{'-' if negative else ''}{mantissa:g}e+{exponent}"


def json_kind(value) -> str:
    """What a value read from JSON is, in JSON's words, for a message about a user's file (Python's had said
    "not a NoneType" of a null, "not a str" of a string, "not list" of an array)."""
    return {type(None): "null", bool: "true or false", int: "a number", float: "a number", str: "a string",
            dict: "an object"}.get(type(value), "a list")


class RedrafterError(Exception):
    """Base class: anything a user can fix (bad input, missing files, wrong model)."""


class RedrafterWarning(RuntimeWarning):
    """Something off about a model that still loads (no end token named, a tied head that is not the embedding,
    speculation off after the self-check): warned, and told to load()'s `progress` too. The command lines, which
    print what progress tells them, do not print the warning as well."""


class ModelNotFoundError(RedrafterError):
    """A model name, path or hub id that resolves to nothing."""


class UnsupportedModelError(RedrafterError):
    """An architecture, quantization type or tokenizer this tool cannot run."""


class CorruptModelError(RedrafterError):
    """A file that exists but cannot be read (truncated, wrong checksum, missing tensors)."""


class DrafterMismatchError(RedrafterError):
    """A drafter whose hidden size or vocabulary does not fit the base model."""


class ContextLengthError(RedrafterError, ValueError):
    """The prompt does not fit in the model's context window. Also a ValueError (a bad input value, as
    InvalidPromptError is)."""


class EmptyPromptError(RedrafterError, ValueError):
    """Nothing to generate from. Also a ValueError (a bad input value, as InvalidPromptError is)."""


class InvalidPromptError(RedrafterError, ValueError):
    """A prompt that is not text, a list of messages or a list of token ids the model has: a
    token id out of range crashed the process inside MLX. Also a ValueError."""


class NetworkError(RedrafterError):
    """A download was needed and the network (PyPI or the Hugging Face hub) is not reachable."""


class SettingError(RedrafterError, ValueError):
    """A generation setting out of range (max_tokens, temperature, seed, a drafting option).
    Also a ValueError, as a bad argument value is in Python."""
