"""The chat screen's widgets: transcript entries, the prompt box with history, the stats panel.

They only display what they are given; the app decides what happens (see app.py).
"""

from typing import List, Optional, Tuple

from markdown_it import MarkdownIt
from rich.cells import cell_len, get_character_cell_size
from rich.table import Table
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.expand_tabs import expand_tabs_inline
from textual.containers import VerticalScroll
from textual.widgets import Input, Markdown, Static

from .stats_view import Row, as_text


# Control characters of a message as the screen shows them: a reply (or a paste) holding an escape sequence
# ("\x1b[2J", "\x1b]0;title") was drawn as written, since Textual strips only BEL, BS, VT, FF and CR, and so
# reached the terminal, to clear or garble the screen. C0 controls show as their control pictures (ESC as ␛), DEL as ␡, C1 as �;
# line breaks and tabs stay, CR goes (as Textual dropped it). The conversation keeps the text as it was.
_VISIBLE = {code: 0x2400 + code for code in range(0x20) if code not in (0x09, 0x0A, 0x0D)}
_VISIBLE.update({0x0D: None, 0x7F: 0x2421, **{code: 0xFFFD for code in range(0x80, 0xA0)}})


# The prompt box shows one mark a character, CR included (Input's cursor and selection count characters).
_VISIBLE_IN_BOX = {**_VISIBLE, 0x0D: 0x240D}


def visible(text: str) -> str:
    """`text` with its control characters shown instead of sent to the terminal."""
    return text.translate(_VISIBLE)


class UserMessage(Static):
    def __init__(self, text: str):
        super().__init__(visible(text), markup=False, classes="user")
        self.border_title = "you"


def _markdown_parser() -> MarkdownIt:
    """Textual's parser ("gfm-like") with raw HTML read as text: the widget drops HTML it cannot draw, so a
    reasoning model's <think> block vanished whole, and a reply's "<b>42</b>" or "use <br> here" lost its tags
    (the reply shown was not the one the model gave, which the conversation keeps and Ctrl+Y copies)."""
    return MarkdownIt("gfm-like", {"html": False})


class AssistantMessage(Markdown):
    """A reply, rendered as Markdown while it streams in (HTML in it shown as written)."""

    def __init__(self):
        super().__init__("", classes="assistant -streaming", parser_factory=_markdown_parser)
        self.border_title = "assistant"
        self.text = ""
        self._stream = None

    async def show(self, text: str):
        """Show the reply so far (`text` only ever grows)."""
        delta = text[len(self.text) :]
        if not delta:
            return
        self.text = text
        if self._stream is None:
            self._stream = Markdown.get_stream(self)
        await self._stream.write(visible(delta))

    async def finish(self, note: str = ""):
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.remove_class("-streaming")
        self.border_subtitle = note


class Notice(Static):
    """A line from the app itself: load progress, errors, help, mode changes."""

    def __init__(self, text: str = "", kind: str = "info", markup: bool = False):
        super().__init__(visible(text), markup=markup, classes=f"notice -{kind}")

    def update(self, content="", *, layout: bool = True) -> None:
        # (a load error, a file name or a library's words in a notice can hold an escape sequence)
        super().update(visible(content) if isinstance(content, str) else content, layout=layout)

    def set_kind(self, kind: str):
        self.remove_class("-info", "-warning", "-error")
        self.add_class(f"-{kind}")


class LoadStatus(Notice):
    """Model loading, one line per stage: ✓ done, … running, ✗ failed."""

    def __init__(self, model: str):
        super().__init__()
        self.model = model
        self.stages: List[Tuple[str, str]] = []
        self.state = "running"  # running | done | failed
        self.footer = ""

    def on_mount(self):
        self._render_stages()

    def progress(self, stage: str, text: str):
        if self.stages and self.stages[-1][0] == stage:
            self.stages[-1] = (stage, text)
        else:
            self.stages.append((stage, text))
        self._render_stages()

    def done(self, footer: str):
        self.state, self.footer = "done", footer
        self._render_stages()

    def failed(self, error: str):
        self.state, self.footer = "failed", error
        self.set_kind("error")
        self._render_stages()

    def _render_stages(self):
        lines = [f"Loading {self.model}"]
        for i, (stage, text) in enumerate(self.stages):
            last = i == len(self.stages) - 1
            mark = {"running": "…", "done": "✓", "failed": "✗"}[self.state] if last else "✓"
            lines.append(f" {mark} {stage:<8} {text}")
        if self.footer:
            lines.append(self.footer)
        self.update("\n".join(lines))


class PromptInput(Input):
    """The prompt box: Enter sends (Input.Submitted), up/down walk the sent prompts.

    A one-line box: a pasted text keeps its line breaks as NEWLINE marks (Input itself keeps
    only a paste's first line), which `message()` turns back into line breaks when it is sent."""

    NEWLINE = "⏎"

    BINDINGS = [
        Binding("up", "history(-1)", "Previous prompt", show=False),
        Binding("down", "history(1)", "Next prompt", show=False),
    ]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.history: List[str] = []
        self._index: Optional[int] = None  # position while walking the history
        self._draft = ""  # what was typed before walking

    @property
    def _shown_value(self) -> str:
        # What the box draws: a pasted escape sequence shows as control pictures (Input drew it as written, and the
        # terminal ran it); the value, sent as the message, keeps it. Input's cell positions (the cursor's, where
        # the box scrolls to, a click's) are counted in what it draws: in the value, an ESC is 0 cells wide.
        return self.value.translate(_VISIBLE_IN_BOX)

    @property
    def _value(self) -> Text:
        return Text(self._shown_value, no_wrap=True, overflow="ignore", end="")

    def _position_to_cell(self, position: int) -> int:
        return cell_len(expand_tabs_inline(self._shown_value[:position], 4))

    def _cell_offset_to_index(self, offset: int) -> int:
        cells, scroll_x = 0, self.scroll_offset[0]
        for index, char in enumerate(self._shown_value):
            width = get_character_cell_size(char)
            if cells <= offset + scroll_x < cells + width:
                return index
            cells += width
        return max(0, min(offset + scroll_x, len(self.value)))

    @classmethod
    def message(cls, value: str) -> str:
        """The text the model gets for what the box shows."""
        return value.replace(cls.NEWLINE, "\n")

    @classmethod
    def shown(cls, text: str) -> str:
        """What the box shows for a message: every line break str.splitlines() knows (CR, LF, CR LF and the
        rest) as NEWLINE; leading and trailing ones dropped."""
        lines = text.splitlines()
        while lines and not lines[0]:
            lines.pop(0)
        while lines and not lines[-1]:
            lines.pop()
        return cls.NEWLINE.join(lines)

    @classmethod
    def given_back(cls, text: str) -> str:
        """What the box shows for a message handed back unsent (withdrawn, or cancelled while it waited):
        one that starts with / gets the // it was typed with again (Enter ran it as a command)."""
        shown = cls.shown(text)
        head = shown.lstrip()
        return shown[: len(shown) - len(head)] + "/" + head if head.startswith("/") else shown

    def _on_paste(self, event: events.Paste) -> None:
        # Terminals send a pasted line break as "\r" (what Enter sends: VTE, xterm, iTerm2, Windows Terminal),
        # so "\n" alone is not the test.
        text = self.shown(event.text)
        if text == event.text:
            return  # Input's own paste
        event.prevent_default()  # Input's keeps the first line alone (empty for a paste that starts with a break)
        event.stop()
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)

    def remember(self, text: str):
        if not self.history or self.history[-1] != text:
            self.history.append(text)
        self._index = None

    def action_history(self, delta: int):
        if not self.history or (self._index is None and delta > 0):
            return
        if self._index is None:
            self._draft, self._index = self.value, len(self.history)
        self._index = max(0, min(len(self.history), self._index + delta))
        if self._index == len(self.history):
            self.value, self._index = self._draft, None
        else:
            self.value = self.history[self._index]
        self.cursor_position = len(self.value)


class StatsPanel(Static):
    """Live figures of the current reply and the session (rows from stats_view)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.plain = ""

    def show(self, rows: List[Row]):
        plain = as_text(rows)
        if plain == self.plain:
            return
        self.plain = plain
        # A grid, so that a value too long for its column wraps under itself: as one text, "adaptive · 0% of
        # steps parked (plain)" and "adaptive (sized each step to this machine)", rows of the default mode,
        # went on at the panel's left edge, under the labels.
        grid = Table.grid()
        grid.add_column(width=13, no_wrap=True)
        grid.add_column()
        for label, value in rows:
            if value is None:
                grid.add_row(Text(visible(label), style="bold"))
            else:  # (--system, a model's path: what the user gave, escape sequences included)
                grid.add_row(Text(visible(label), style="dim"), Text(visible(value)))
        # The panel's size is fixed by chat.tcss (width 48, height 1fr, scrolls), so no layout
        # pass: one over the whole screen (every Markdown block of the transcript) cost ~20 ms
        # per update, which slowed decoding while a reply streamed.
        self.update(grid, layout=False)


class Transcript(VerticalScroll, can_focus=False):
    """The conversation; stays scrolled to the end while replies stream, until the user scrolls up.

    It never takes the focus (PgUp/PgDn scroll it from the prompt box, the wheel anywhere): a click on a reply,
    to select its text, moved the focus here, and what was typed next went nowhere, silently."""

    def on_mount(self):
        self.anchor()
