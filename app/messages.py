"""Messages the app's thread workers post to the UI (the only way they reach it).

A reply streams as `ReplyProgress` messages that carry the whole text so far, so Textual can
drop one that a newer one supersedes when the UI falls behind (`can_replace`) without losing
text; the last one of a reply (finish_reason set) is never dropped.
"""

from typing import Optional

from textual.message import Message

from .engine import EngineInfo, Stats


class LoadProgress(Message):
    def __init__(self, stage: str, text: str):
        super().__init__()
        self.stage, self.text = stage, text


class LoadFinished(Message):
    def __init__(self, info: EngineInfo):
        super().__init__()
        self.info = info


class LoadFailed(Message):
    def __init__(self, error: str, details: str = ""):
        super().__init__()
        self.error = error
        self.details = details  # the error's whole text, where `error` is its first line alone (else "")


class ReplyProgress(Message):
    def __init__(self, reply_id: int, text: str, stats: Stats, finish_reason: Optional[str]):
        super().__init__()
        self.reply_id, self.text, self.stats, self.finish_reason = reply_id, text, stats, finish_reason

    def can_replace(self, message: Message) -> bool:
        # Textual asks the queued message whether the next one may take its place.
        return isinstance(message, ReplyProgress) and message.reply_id == self.reply_id and self.finish_reason is None


class ReplyStatus(Message):
    """A line about a reply before its first token (a long prompt being read)."""

    def __init__(self, reply_id: int, text: str):
        super().__init__()
        self.reply_id, self.text = reply_id, text


class ReplyFailed(Message):
    def __init__(self, reply_id: int, error: str, text: str, details: str = ""):
        super().__init__()
        self.reply_id, self.error, self.text = reply_id, error, text
        self.details = details  # the error's whole text, where `error` is its first line alone (else "")
