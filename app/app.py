"""The redrafter-chat Textual app: a streamed multi-turn chat with live decoding stats.

`create_app(engine, settings)` is the seam: the console script passes the real MLX `Engine`,
tests pass a scripted `FakeEngine`. The app never touches MLX; workers talk to the engine
and reach the UI only by posting messages (messages.py):

    mount -> load worker:  engine.start_load(progress)  -> LoadProgress* -> LoadFinished | LoadFailed
    Enter -> reply worker: engine.reply(messages, ...)  -> ReplyProgress* (last has finish_reason) | ReplyFailed

Cancelling (Esc, Ctrl+C) sets the reply's stop flag, which the library checks between
steps: what was streamed stays, and becomes the assistant turn of the conversation, so the
next prompt re-uses the KV cache up to there. Settings (speculative on/off, beam width and
length) change live and apply from the next reply.
"""

import asyncio
import threading
import time
import unicodedata
from dataclasses import replace
from typing import Callable, Dict, List, Optional

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header

from .engine import COPY_GROWTH, SEED_MAX, EngineError, EngineInfo, Settings, Stats, compact, failure
from .messages import LoadFailed, LoadFinished, LoadProgress, ReplyFailed, ReplyProgress, ReplyStatus
from .stats_view import Baseline, speculative_state, stats_rows
from .widgets import AssistantMessage, LoadStatus, Notice, PromptInput, StatsPanel, Transcript, UserMessage, visible

BEAM_LIMITS = (1, 16)
STATS_MIN_WIDTH = 100  # narrower terminals start with the stats panel hidden (F2 shows it): it takes 48 columns
# While a reply streams, the reply and the stats panel are redrawn at most this often (the
# newest progress wins; the end of a reply is drawn at once). Every redraw is Python work that
# competes with decoding for the CPU and the GIL: on the 2-core CPU, redrawing on every step
# halved tok/s in the app, plain and speculative alike.
UPDATE_SECONDS = 0.1
# A note is written in the bubble's bottom border, and cut there ("…") past its width: 41 characters at 100
# columns, the narrowest terminal that shows the stats panel beside the conversation ("stopped: max tokens (256;
# --max-tokens s…" and "stopped: context full · Ctrl+N starts a new c…", what to do cut off).
FINISH_NOTES = {
    "eos": "",
    # (it said "max tokens" alone: not how many, nor that the chat's --max-tokens sets it, 256 unless given)
    "length": "stopped at {max_tokens} tokens (--max-tokens)",
    # the conversation fills the model's context: a next message cannot fit (it failed, and only then said so)
    "context": "stopped: context full · Ctrl+N new chat",
    "cancelled": "cancelled",
}
HELP = """\
Keys
  Enter send · ↑/↓ prompt history · PgUp/PgDn scroll the conversation
  Esc or Ctrl+C cancel the reply, or a message waiting for the model to load (with text selected, Ctrl+C copies it)
  Ctrl+N new chat · Ctrl+Y copy the last reply · Ctrl+Q quit
  Ctrl+T speculative decoding on/off · F2 stats panel on/off
  {beam_keys} · Ctrl+P all commands
  A pasted text keeps its line breaks, shown as ⏎
Commands
  /new (or /clear) · /copy · /spec [on|off] · /beam W L · /width N · /length N (a fixed beam{beam_needs}) · /auto (adaptive)
  /seed N (every reply drawn with seed N, as --seed N) · /seed (the last reply's seed) · /seed off (a fresh one each)
  /stats (the panel on/off) · /details (a failed reply's whole error) · /help · /quit (or /exit)
  A message starting with / is sent as such when written //"""
# Textual's copy_to_clipboard writes an OSC 52 sequence and cannot know what the terminal did with it: "Copied"
# was said in terminals that ignore it (macOS Terminal, tmux without set-clipboard), the clipboard unchanged.
TO_CLIPBOARD = "to the terminal's clipboard (OSC 52: some terminals ignore it, macOS Terminal among them)."
COMMANDS = {  # each /command as it is written, for the notice on bad arguments
    # (/clear, /quit and /exit, what other terminal chats take, answered "Unknown command")
    "new": "/new", "clear": "/clear", "quit": "/quit", "exit": "/exit", "copy": "/copy",
    "spec": "/spec, /spec on or /spec off", "beam": "/beam W L (or /beam WxL)",
    "width": "/width N", "length": "/length N", "auto": "/auto", "help": "/help", "stats": "/stats",
    "details": "/details", "seed": "/seed N (0 to 2**64 - 1), /seed or /seed off",
}


def blank(text: str) -> bool:
    """Whether a message shows nothing: whitespace and invisible format or control characters alone (a
    zero-width space was sent, and answered). redrafter_mlx.tokenizer.is_blank's rule (a test checks
    they agree): the app does not import the library, which imports MLX."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc") for ch in text)


def trimmed(text: str) -> str:
    """A message as typed, less its leading blank lines and trailing whitespace: the first line's
    indentation stays (strip() took it, so pasted code lost it)."""
    lines = text.rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


# F5/F6 and F7/F8 each under one label, in a compact footer: at 80 columns (macOS Terminal's default window) the
# footer ended at "f6 Width+", the length keys out of sight
WIDTH_KEYS, LENGTH_KEYS = Binding.Group("Width"), Binding.Group("Length")


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "redrafter-chat"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # with text selected (in the conversation or the prompt box) it copies that instead: a user copying part of a
        # streaming reply stopped it
        Binding("ctrl+c", "cancel_or_copy", "Cancel", show=False, priority=True),
        # with nothing to cancel and no text selected to copy: the binding above replaced Textual's own ctrl+c
        # (help_quit), and the reflex of quitting with Ctrl+C did nothing at all, silently
        Binding("ctrl+c", "nothing_to_cancel", show=False, system=True),
        # "New" and "Spec" (as /spec), not "New chat" and "Speculative": at 80 columns, while a reply streams (or a
        # message waits for the model), "esc Cancel" pushed the F7/F8 keys under the palette's, the footer ending
        # "f5 f6 Width f"
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+y", "copy_reply", "Copy"),
        Binding("ctrl+t", "toggle_speculative", "Spec"),
        Binding("f2", "toggle_stats", "Stats", show=False),
        # the prompt box has the focus, and a one-line box has no page to turn: PgUp/PgDn did nothing, and a long
        # reply could be read back by keyboard only after Tab moved the focus to the transcript
        Binding("pageup", "page_transcript(-1)", "Scroll up", show=False),
        Binding("pagedown", "page_transcript(1)", "Scroll down", show=False),
        Binding("f5", "beam('width', -1)", "Width−", group=WIDTH_KEYS),
        Binding("f6", "beam('width', 1)", "Width+", group=WIDTH_KEYS),
        Binding("f7", "beam('length', -1)", "Length−", group=LENGTH_KEYS),
        Binding("f8", "beam('length', 1)", "Length+", group=LENGTH_KEYS),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, engine, settings: Optional[Settings] = None):
        super().__init__()
        self.engine = engine
        self.settings = settings or Settings()
        self.info: Optional[EngineInfo] = None
        self.status = "loading"  # loading | ready | generating | cancelling | cancelled | load failed
        self.messages: List[Dict[str, str]] = []  # the conversation sent to the model
        self.stats: Optional[Stats] = None  # the current (or last) reply's figures
        self.baseline = Baseline()
        self.reply_id = 0
        self.reply_view: Optional[AssistantMessage] = None
        self._cancel: Optional[threading.Event] = None
        self._after_reply: Optional[Callable] = None  # runs once the cancelled reply has ended
        self._pending: Optional[ReplyProgress] = None  # newest progress not drawn yet
        self._drawn_at = 0.0  # time.monotonic() of the last streamed redraw
        self._footer_state: Optional[tuple] = None  # the state the footer's bindings show
        self._explaining = False  # on_key runs a hidden (idle) key's action, to say why it does nothing
        self._queued: Optional[str] = None  # a message sent while the model was loading
        self._before = ("ready", None)  # status and stats before the running reply
        self.user_view: Optional[UserMessage] = None  # the prompt bubble of the reply that runs
        self.load_error: Optional[str] = None  # why the model did not load (main() prints it after the app)
        self.load_details: Optional[str] = None  # its whole text, where load_error is its first line (main() prints it)
        self._stats_shown: Optional[bool] = None  # the user's choice (F2, /stats); None: by the terminal's width
        self.error_details: Optional[str] = None  # the last failed reply's whole error, where its notice was cut

    # ---- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(icon="»")
        with Horizontal(id="main"):
            yield Transcript(id="transcript")
            yield StatsPanel(id="stats")
        yield PromptInput(id="prompt", placeholder="Loading the model…")
        yield Footer(compact=True)

    def on_mount(self):
        self.load_status = LoadStatus(self.engine.label)
        self.query_one(Transcript).mount(self.load_status)
        self.query_one(PromptInput).focus()
        self._fit_stats()
        self._refresh()
        self._load()

    def on_resize(self):
        self._fit_stats()

    def _fit_stats(self):
        """The stats panel takes 48 columns: shown from STATS_MIN_WIDTH columns up, unless the user chose."""
        shown = self._stats_shown if self._stats_shown is not None else self.size.width >= STATS_MIN_WIDTH
        self.query_one(StatsPanel).display = shown

    @property
    def generating(self) -> bool:
        return self.status in ("generating", "cancelling")

    @property
    def cancellable(self) -> bool:
        """A reply runs, or a message waits for the model to load: Esc and Ctrl+C cancel it."""
        return self.generating or self._queued is not None

    @property
    def ready(self) -> bool:
        return self.info is not None

    def _refresh(self):
        """Redraw the stats panel and the header from the app's state."""
        status = {"generating": "generating…", "cancelling": "cancelling…"}.get(self.status, self.status)
        self.query_one(StatsPanel).show(stats_rows(self.info, self.settings, self.stats, self.baseline, status))
        # the footer shows "Cancel" only while there is one, F5-F8 only with a drafter, New chat and Copy once the
        # model is loaded, no setting keys after a failed load
        footer = (self.cancellable, self.status if self.status in ("loading", "load failed") else None,
                  self.info is not None and self.info.drafter is None)
        if footer != self._footer_state:
            self._footer_state = footer
            self.refresh_bindings()
        if self.info is not None:
            spec = speculative_state(self.info, self.settings)
            shape = "" if spec != "on" else " adaptive" if self.settings.adaptive else \
                f" {self.settings.beam_width}×{self.settings.beam_length}"
            self.sub_title = visible(f"{self.info.model} · speculative {spec.split(' ')[0]}{shape}")

    async def _add(self, widget):
        await self.query_one(Transcript).mount(widget)
        return widget

    def _note(self, text: str, kind: str = "info"):
        transcript = self.query_one(Transcript)
        transcript.mount(Notice(text, kind))
        transcript.scroll_end(animate=False)  # (scrolled up to read back, /help and a reply's error came out of sight)

    # ---- loading ---------------------------------------------------------------------------

    @work(group="load")
    async def _load(self):
        progress = lambda stage, text: self.post_message(LoadProgress(stage, text))  # noqa: E731 (engine thread)
        try:
            info = await asyncio.wrap_future(self.engine.start_load(progress))
        except Exception as e:  # (an engine that breaks its contract still gets a readable line, as a reply's error)
            failed = e if isinstance(e, EngineError) else failure(e)
            self.post_message(LoadFailed(str(failed), failed.details))
        else:
            self.post_message(LoadFinished(info))

    def on_load_progress(self, msg: LoadProgress):
        self.load_status.progress(msg.stage, msg.text)

    async def on_load_finished(self, msg: LoadFinished):
        info = self.info = msg.info
        self.status = "ready"
        self.baseline.calibration = info.plain_tokens_per_second
        weights = info.weight_format + (f" (stored {info.stored_format})" if info.stored_format else "")
        self.load_status.done(f"Ready in {info.load_seconds:.1f} s: {info.model}, {weights}, on {info.device}.")
        for text in info.notices:
            self._note(text, "warning")
        # A tuned fixed shape is where F5-F8 start from; the adaptive controller needs none (it parks
        # by itself where plain decoding is faster).
        s, shape = self.settings, info.beam_shape
        if shape and s.beam_tuned and not (s.width_given or s.length_given) and shape[1] > 1:
            s.beam_width, s.beam_length = shape
            if s.tree is None and info.tree is not None:
                s.tree = info.tree
        elif shape and s.beam_tuned and s.width_given != s.length_given:
            # -W or -L alone: the other is the tuned one, as tuning.drafting takes it for the main CLI (the chat took
            # 4); a tuned length of 1 (plain decoding fastest) names no length to draft with: -W alone keeps 4
            if s.length_given:
                s.beam_width = shape[0]
            elif shape[1] > 1:
                s.beam_length = shape[1]
        if self.settings.tree_min_prob is not None and not self.settings.tree and info.drafter is not None:
            # --tree-min-prob alone counts on a tree tuned for this device (the command line cannot know one)
            self._note(f"--tree-min-prob {self.settings.tree_min_prob:g} is a dynamic tree's floor, and no tree is "
                       "tuned for this model and device: fixed drafting is W x L beams, which it does not prune. "
                       "Start with --tree N to draft a tree.", "warning")
        if info.drafter is None and not self.settings.adaptive and self.settings.lookup is not None:
            n = self.settings.lookup  # the engine drafts the copy alone (mode auto, lookup=N), as the main CLI does
            self._note(f"Without a drafter, --lookup {n} drafts the conversation's copy alone (fixed): "
                       + (f"{n} tokens a step, twice as many after a copy taken whole, up to {n * COPY_GROWTH}." if n
                          else "nothing, so replies decode plainly.")
                       + " /auto sizes drafting to this machine instead.")
        elif info.drafter is None and not self.settings.adaptive:
            self.settings.adaptive = True
            self._note("A fixed beam needs a drafter and this model has none: drafting stays adaptive, from the "
                       "conversation alone where that pays.", "warning")
        # under STATS_MIN_WIDTH columns the panel starts hidden, and only /help said that F2 shows it
        panel = "" if self.query_one(StatsPanel).display else \
            f" The live stats panel is hidden under {STATS_MIN_WIDTH} columns: F2 shows it."
        if info.drafter is not None:
            how = "adaptive" if self.settings.adaptive else "fixed beam"
            state = f"on, {how}" if self.settings.speculative else f"off (plain decoding; {how} when on)"
            self._note(f"Speculative decoding (ReDrafter) is {state}: Ctrl+T toggles it, F5-F8 fix a beam, "
                       "/auto returns to adaptive. /help lists keys and commands." + panel)
        else:
            self._note("/help lists keys and commands." + panel)
        prompt = self.query_one(PromptInput)
        prompt.placeholder = "Ask something (Enter sends, ↑/↓ history, /help)"
        self._refresh()
        if self._queued is not None:  # typed while loading: send it now
            text, self._queued = self._queued, None
            await self.send(text)

    def on_load_failed(self, msg: LoadFailed):
        self.status, self.load_error, self.load_details = "load failed", msg.error, msg.details or None
        self.load_status.failed(
            f"The model did not load: {msg.error}\nCheck --model / --drafter and start again; Ctrl+Q quits."
        )
        prompt = self.query_one(PromptInput)
        prompt.placeholder = "No model loaded (Ctrl+Q quits)"
        prompt.disabled = True
        if self._queued is not None:  # never sent: give it back, as the box shows it
            prompt.value, self._queued = PromptInput.given_back(self._queued), None
        self._refresh()

    # ---- sending and streaming -------------------------------------------------------------

    async def on_input_submitted(self, event: PromptInput.Submitted):
        prompt = self.query_one(PromptInput)
        text = trimmed(PromptInput.message(event.value))
        if blank(text):  # a pasted run of blank lines shows as "⏎", not as space
            prompt.value = ""
            self.notify("The message is empty: type something first.", severity="warning")
            return
        typed, head = PromptInput.shown(text), text.lstrip()  # typed: what ↑ brings back
        if head.startswith("/") and not head.startswith("//"):
            prompt.remember(typed)
            prompt.value = ""
            await self.run_command(head)
            return
        if head.startswith("//"):
            text = text[: len(text) - len(head)] + head[1:]
        if not self.ready:
            if self.status != "loading":
                return
            if self._queued is not None:
                self.notify("A message is already waiting for the model: send this one after it.",
                            severity="warning")
                return
            prompt.remember(typed)  # keep it, and send it once the model is ready
            prompt.value = ""
            self._queued = text
            self._note("The model is still loading: this message is sent as soon as it is ready (Esc cancels it).")
            self._refresh()
            return
        if self.generating:  # (while cancelling, "Esc cancels it" sent the user to a key already pressed)
            self.notify("A reply is still running: Esc cancels it." if self.status == "generating" else
                        "The reply is being cancelled: send this once it has stopped.", severity="warning")
            return
        prompt.remember(typed)
        prompt.value = ""
        await self.send(text)

    async def send(self, text: str):
        """Add a user turn and start streaming the reply."""
        self.messages.append({"role": "user", "content": text})
        self.user_view = await self._add(UserMessage(text))
        self.reply_view = await self._add(AssistantMessage())
        # back to the end, following the reply again: scrolled up to read back (PgUp, the wheel), the transcript
        # stayed there, and the message sent and its reply streamed out of sight
        self.query_one(Transcript).scroll_end(animate=False)
        self.reply_id += 1
        self._cancel = threading.Event()
        self._before = self.status, self.stats  # what the panel showed, for a reply withdrawn before a word
        self.status, self.stats = "generating", None
        self._refresh()
        self._reply(self.reply_id, list(self.messages), replace(self.settings), self._cancel)

    @work(thread=True, group="reply")
    def _reply(self, reply_id: int, messages, settings: Settings, cancel: threading.Event):
        text, last = "", None
        try:
            on_status = lambda line: self.post_message(ReplyStatus(reply_id, line))  # noqa: E731 (engine thread)
            for chunk in self.engine.reply(messages, settings, cancel.is_set, on_status):
                text += chunk.text
                last = chunk
                self.post_message(ReplyProgress(reply_id, text, chunk.stats, chunk.finish_reason))
        except Exception as e:  # (an engine that breaks its contract: its error named, cut to a line as the engine's)
            failed = e if isinstance(e, EngineError) else failure(e)
            self.post_message(ReplyFailed(reply_id, str(failed), text, failed.details))
        else:
            if last is None or last.finish_reason is None:
                self.post_message(ReplyFailed(reply_id, "the engine ended the reply without a reason", text))

    def on_reply_status(self, msg: ReplyStatus):
        if msg.reply_id == self.reply_id and self.reply_view is not None and not self.reply_view.text \
                and self.status != "cancelling":
            self.reply_view.border_subtitle = msg.text

    async def on_reply_progress(self, msg: ReplyProgress):
        if msg.reply_id != self.reply_id or self.reply_view is None:
            return
        if msg.text and not self.reply_view.text and self.status != "cancelling":
            self.reply_view.border_subtitle = ""  # the prompt has been read
        if msg.finish_reason is None:  # keep the newest; a timer draws it (see UPDATE_SECONDS)
            if self._pending is None:
                self.set_timer(max(0.001, self._drawn_at + UPDATE_SECONDS - time.monotonic()), self._draw_pending)
            self._pending = msg
            return
        self._pending = None  # the final message holds everything
        if msg.finish_reason == "cancelled" and not msg.text:  # cancelled before a word: as if never sent
            back = await self._withdraw()
            self._note("Cancelled before the reply began: the message was taken back"
                       + (" into the prompt box (Enter sends it again)." if back else
                          " (the prompt box held other text: ↑ finds it in the history)."))
            # the panel as it was before it: that reply's prefill-only figures stayed, of a reply that is gone
            self.status, self.stats = self._before
            await self._reply_ended()
            return
        self.stats = msg.stats
        await self.reply_view.show(msg.text)
        note = FINISH_NOTES.get(msg.finish_reason, msg.finish_reason).format(max_tokens=self.settings.max_tokens)
        if blank(msg.text):  # an empty bubble said nothing at all (a model that ends its turn at once)
            note = "empty reply" + (f" · {note}" if note else "")
        await self.reply_view.finish(note)
        self.messages.append({"role": "assistant", "content": msg.text})
        self.baseline.observe(msg.stats)
        self.status = "cancelled" if msg.finish_reason == "cancelled" else f"done ({msg.finish_reason})"
        await self._reply_ended()

    async def _draw_pending(self):
        msg, self._pending = self._pending, None
        if msg is None or not self._drawing(msg):
            return
        self._drawn_at = time.monotonic()
        await self.reply_view.show(msg.text)
        if not self._drawing(msg):  # (the app was torn down, or the reply ended, while the reply was drawn)
            return
        self.stats = msg.stats
        self._refresh()

    def _drawing(self, msg: ReplyProgress) -> bool:
        """Whether a streamed redraw (`_draw_pending`, from a timer) is still wanted: its reply still runs, and the
        app is not being torn down. Quitting mid-reply, the timer's redraw ran after the widgets were gone, and its
        NoMatches (StatsPanel) ended the chat with a traceback."""
        return (self.is_running and msg.reply_id == self.reply_id and self.reply_view is not None
                and self.reply_view.is_attached)

    async def on_reply_failed(self, msg: ReplyFailed):
        if msg.reply_id != self.reply_id or self.reply_view is None:
            return
        self._pending = None
        await self.reply_view.show(msg.text)  # what was streamed, drawn or not yet
        await self.reply_view.finish("error")
        where = ""
        if msg.text:  # keep what was streamed, as a cancel would
            self.messages.append({"role": "assistant", "content": msg.text})
        else:  # the model never answered: leave the prompt out of the conversation, and the panel's figures
            back = await self._withdraw()  # those of the reply before it, as a cancel before a word does (they went
            self.stats = self._before[1]  # blank); said as a cancel says it (the bubble vanished without a word)
            where = "\nThe message was taken back" + (" into the prompt box." if back else
                                                       " (the prompt box held other text: ↑ finds it in the history).")
        # the notice keeps to the error's first line; the rest of it (a library's or MLX's message over several
        # lines) was lost: /details shows it
        self.error_details = msg.details or None
        more = " (/details shows the whole error)" if msg.details else ""
        self._note(f"The reply failed: {msg.error}{more}{where}", "error")
        self.status = "error"
        await self._reply_ended()

    async def _withdraw(self):
        """Take back the user turn whose reply never began: out of the conversation and the
        transcript, its text back in the prompt box (unless something else was typed there: then
        False)."""
        turn = self.messages.pop()
        for view in (self.reply_view, self.user_view):
            if view is not None:
                await view.remove()
        prompt = self.query_one(PromptInput)
        if prompt.value or self._after_reply == self._new_chat:  # (a new chat's box began with the old message)
            return False
        prompt.value = PromptInput.given_back(turn["content"])
        prompt.cursor_position = len(prompt.value)
        return True

    async def _reply_ended(self):
        self.reply_view, self.user_view, self._cancel = None, None, None
        self._refresh()
        then, self._after_reply = self._after_reply, None
        if then is not None:
            await then()

    # ---- actions ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters) -> Optional[bool]:
        if action in ("cancel", "cancel_or_copy"):
            return self.cancellable  # otherwise Ctrl+C goes on to the prompt box or the screen (copy)
        if self._idle(action) and not self._explaining:  # out of the footer; the key still says why (on_key)
            return False
        return True

    def _idle(self, action: str) -> bool:
        """Whether an action's key would do nothing now, only say why: F5-F8 without a drafter (the footer
        showed Width−/Width+/Length−/Length+ over a model with none), new chat and copy while the model loads
        (new chat takes back a message waiting for it), and the setting, new-chat and copy keys after a failed
        load."""
        if self.status == "load failed":
            return action in ("beam", "toggle_speculative", "new_chat", "copy_reply")
        if self.status == "loading":  # no reply to copy yet, nor a conversation to clear (but a message waiting)
            return action == "copy_reply" or (action == "new_chat" and self._queued is None)
        return action == "beam" and self.info is not None and self.info.drafter is None

    async def on_key(self, event):
        """A key whose binding is hidden because it would do nothing (`_idle`) runs no action in Textual,
        silently: run it anyway, to say why nothing changes. Not over a modal screen (the command palette), which
        keeps the app's keys from running."""
        if self.screen.is_modal:
            return
        for binding in self.BINDINGS:
            if binding.key == event.key and self._idle(binding.action.partition("(")[0]):
                event.stop()
                self._explaining = True
                try:
                    await self.run_action(binding.action)
                finally:
                    self._explaining = False
                return

    def action_cancel(self):
        if self._queued is not None:  # sent while loading: Esc did nothing, and it was sent once the model loaded
            text, self._queued = self._queued, None
            prompt = self.query_one(PromptInput)
            if not prompt.value:
                prompt.value = PromptInput.given_back(text)
                prompt.cursor_position = len(prompt.value)
            back = "it is back in the box" if prompt.value == PromptInput.given_back(text) else "↑ brings it back"
            self.notify(f"The waiting message is cancelled, not sent: {back}.")
            self._refresh()
            return
        if self._cancel is not None and not self._cancel.is_set():
            self._cancel.set()
            self.status = "cancelling"
            # said on the reply itself: the panel said it alone, and it is hidden under STATS_MIN_WIDTH columns, while
            # the reply stops only after its step, or the chunk of a long prompt it is reading (seconds), nothing
            # on screen changing meanwhile
            if self.reply_view is not None:
                self.reply_view.border_subtitle = "cancelling…"
            self._refresh()

    def action_cancel_or_copy(self):
        """Ctrl+C while there is something to cancel: the text selected, if any, is copied (Textual's own Ctrl+C,
        which the chat's binding comes before), and the reply goes on; else it is cancelled, as Esc does."""
        selected = self.screen.get_selected_text() or self.query_one(PromptInput).selected_text
        if not selected:
            self.action_cancel()
            return
        self.copy_to_clipboard(selected)
        self.notify(f"Sent the selected text ({len(selected)} characters) {TO_CLIPBOARD} The reply goes on: Esc "
                    "cancels it.")

    def action_nothing_to_cancel(self):
        self.notify("Nothing to cancel: Ctrl+Q quits (Ctrl+C copies selected text).")

    async def action_new_chat(self):
        if self.generating:
            self._after_reply = self._new_chat
            self.action_cancel()
        else:
            await self._new_chat()

    async def _new_chat(self):
        if not self.ready:
            # The transcript holds the load status (and a failure's reason): clearing it hid both, and a
            # message typed while loading was still sent after "New chat.".
            if self._queued is not None:
                self.query_one(PromptInput).value, self._queued = PromptInput.given_back(self._queued), None
                self._refresh()  # (the footer's Cancel)
                self.notify("Your message was taken back into the box: the model is still loading.")
            else:
                self.notify("Nothing to clear yet: " + ("the model did not load." if self.load_error else
                                                        "the model is still loading."), severity="warning")
            return
        self.messages.clear()
        self.stats = None
        self.status = "ready" if self.ready else self.status
        self.engine.new_chat()
        transcript = self.query_one(Transcript)
        await transcript.remove_children()
        await transcript.mount(Notice("New chat."))
        self._refresh()

    def action_copy_reply(self):
        if self.reply_view is not None:  # a reply runs: it is the one on screen, not the one before it
            so_far = self._pending.text if self._pending is not None else self.reply_view.text
            if not so_far:
                self.notify("Nothing to copy yet: the reply has not begun.", severity="warning")
                return
            self.copy_to_clipboard(so_far)
            self.notify(f"Sent the reply so far ({len(so_far)} characters; it is still running) {TO_CLIPBOARD}")
            return
        last = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant" and m["content"]), None)
        if last is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(last)
        self.notify(f"Sent the last reply ({len(last)} characters) {TO_CLIPBOARD}")

    def _later(self) -> str:
        return " (from the next reply)" if self.generating else ""

    def _spec_off(self) -> str:
        """A drafting change made while speculation is off says so: the replies went on decoding plainly."""
        return "" if self.settings.speculative else " Speculative decoding is off: Ctrl+T turns it on."

    def _no_model(self) -> bool:
        """After a failed load, whether to say so instead of changing a setting nothing will use (Ctrl+T and
        F5-F8 answered "Speculative decoding off." and "Beam: 5 × 4" with no model to decode)."""
        if self.status == "load failed":
            self.notify("No model is loaded, so nothing uses this setting: Ctrl+Q quits (start again with another "
                        "--model).", severity="warning")
        return self.status == "load failed"

    def action_toggle_speculative(self, on: Optional[bool] = None):
        if self._no_model():
            return
        self.settings.speculative = (not self.settings.speculative) if on is None else on
        self.notify(f"Speculative decoding {'on' if self.settings.speculative else 'off'}{self._later()}.")
        self._refresh()

    def action_beam(self, which: str, delta: int):
        width, length = self.settings.beam_width, self.settings.beam_length
        if which == "width":
            width += delta
        else:
            length += delta
        self.set_beam(width, length)

    def set_beam(self, width: int, length: int, typed: bool = False):
        """A fixed beam of width x length. The keys step within the limits (a step past one stays at it);
        a typed shape past them is refused, saying the limits (it was clamped without a word)."""
        if self._no_model():
            return
        if self.info is not None and self.info.drafter is None:
            how = "adaptive, from the conversation alone" if self.settings.adaptive else \
                "the conversation's copy alone (--lookup)"
            self.notify(f"A fixed beam needs a drafter and this model has none: drafting stays {how}.",
                        severity="warning")
            return
        lo, hi = BEAM_LIMITS
        # a shape the command line set past the keys' range stays reachable: F8 on -W 32 -L 4 gave 16 x 5
        top_w, top_l = max(hi, self.settings.beam_width), max(hi, self.settings.beam_length)
        if typed:
            for what, n, top in (("width", width, top_w), ("length", length, top_l)):
                if not lo <= n <= top:
                    self.notify(f"A beam {what} is {lo} to {top}, not {compact(n)}: the beam stays as it was.",
                                severity="warning")
                    return
        width, length = max(lo, min(top_w, width)), max(lo, min(top_l, length))
        self.settings.beam_width, self.settings.beam_length = width, length
        self.settings.adaptive = False
        self.settings.beam_tuned = False  # chosen while the model loads: the tuned shape must not replace it
        graph = "" if self.settings.graph is None or self.settings.tree else \
            " Graph drafting needs a tree (--tree N): this beam drafts without it."
        # (mode redrafter with L = 1 still drafts the lookup copy: "drafts nothing" was said over steps of 9 tokens)
        plain = "" if length != 1 else " A length of 1: the drafter drafts nothing, the conversation's copy alone." \
            if self.settings.lookup != 0 else " A length of 1 with --lookup 0 drafts nothing: plain decoding."
        self.notify(f"Beam: {width} × {length} (width × length), fixed{self._later()}; /auto returns to adaptive."
                    + graph + plain + self._spec_off())
        self._refresh()

    def action_adaptive(self):
        if self._no_model():
            return
        self.settings.adaptive = True
        self.notify(f"Adaptive drafting: each step sized to this machine{self._later()}." + self._spec_off())
        self._refresh()

    def action_help(self):
        # without a drafter F5-F8 and the beam commands only say that a beam needs one (/help listed them as usual)
        none = self._idle("beam") and self.status != "load failed"
        self._note(HELP.format(
            beam_keys="F5-F8 fix a beam: this model has no drafter" if none else
            "F5/F6 beam width −/+ · F7/F8 beam length −/+",
            beam_needs=", which needs a drafter: this model has none" if none else ""))

    def set_seed(self, seed: Optional[int]):
        """Draw every later reply with `seed`, as --seed does from the start (None: a fresh seed for each). A
        later reply drawn with a fresh seed could be drawn again only through the library."""
        if self._no_model():
            return
        if seed is not None and not 0 <= seed <= SEED_MAX:
            self.notify(f"A seed is from 0 to 2**64 - 1, not {compact(seed)}: the seed stays as it was.",
                        severity="warning")
            return
        if self.settings.temperature == 0:  # --seed is refused with greedy decoding: it changes nothing
            self.notify("A seed applies to sampling, and --temperature 0 decodes greedily: start the chat with "
                        "--temperature T above 0 to sample.", severity="warning")
            return
        if seed is None and self.settings.seed is None:
            self.notify("No seed is fixed: each reply draws a fresh one.")
            return
        self.settings.seed = seed
        self.notify(f"Seed {seed}: every reply is drawn with it{self._later()}, the same conversation giving the "
                    "same reply; /seed off draws a fresh one for each." if seed is not None else
                    f"Seed off: each reply draws a fresh one{self._later()}.")
        self._refresh()

    def show_seed(self):
        """The seed the last reply was drawn with (the panel shows it too, when shown), and the one fixed."""
        if self.settings.temperature == 0:
            self.notify("Replies decode greedily (--temperature 0): no seed draws them.")
            return
        last = self.stats.seed if self.stats is not None else None
        said = (f"The last reply was drawn with seed {last}: /seed {last} draws the next ones with it." if last
                is not None else "No sampled reply yet.")
        fixed = self.settings.seed
        self.notify(said + (f" Every reply is drawn with seed {fixed} (/seed off: a fresh one each)."
                            if fixed is not None else " Each reply draws a fresh seed."))

    def action_details(self):
        """The last failed reply's whole error, whose notice said its first line."""
        if self.error_details is None:
            self.notify("No error to show in full: /details shows a failed reply's error where its notice kept to "
                        "the first line.", severity="warning")
            return
        self._note(f"The last failed reply's error, in full:\n{self.error_details}", "error")

    def action_page_transcript(self, pages: int):
        transcript = self.query_one(Transcript)
        transcript.scroll_page_down() if pages > 0 else transcript.scroll_page_up()

    def action_toggle_stats(self):
        self._stats_shown = not self.query_one(StatsPanel).display
        self._fit_stats()

    async def run_command(self, line: str):
        """The prompt box's /commands. One notice for a line that is not one: an unknown name, or a known
        command's wrong arguments, with how that command is written (they read "Unknown command")."""
        name, *args = line[1:].lower().split() or [""]
        if name not in COMMANDS:
            # (markup=False: Textual read what was typed as markup: "/x [/b]" crashed the chat with a MarkupError)
            self.notify(f"Unknown command {line!r}: /help lists them (// sends a message that starts with /).",
                        severity="warning", markup=False)
            return
        try:
            if name in ("new", "clear", "quit", "exit", "copy", "auto", "help", "stats", "details") and args:
                raise ValueError
            if name in ("new", "clear"):
                await self.action_new_chat()
            elif name in ("quit", "exit"):
                await self.action_quit()  # (Ctrl+Q's)
            elif name == "copy":
                self.action_copy_reply()
            elif name == "spec" and args in ([], ["on"], ["off"]):
                self.action_toggle_speculative(None if not args else args[0] == "on")
            elif name == "beam" and len(args) in (1, 2):
                w, l = args if len(args) == 2 else args[0].replace("×", "x").split("x")  # "2×5" as the panel writes it
                self.set_beam(int(w), int(l), typed=True)
            elif name == "width" and len(args) == 1:
                self.set_beam(int(args[0]), self.settings.beam_length, typed=True)
            elif name == "length" and len(args) == 1:
                self.set_beam(self.settings.beam_width, int(args[0]), typed=True)
            elif name == "auto":
                self.action_adaptive()
            elif name == "help":
                self.action_help()
            elif name == "stats":
                self.action_toggle_stats()
            elif name == "details":
                self.action_details()
            elif name == "seed" and not args:
                self.show_seed()
            elif name == "seed" and args == ["off"]:
                self.set_seed(None)
            elif name == "seed" and len(args) == 1:
                self.set_seed(int(args[0]))
            else:
                raise ValueError
        except ValueError:
            numbers = " (whole numbers)" if name in ("beam", "width", "length") else ""
            self.notify(f"{line.strip()!r}: /{name} is written {COMMANDS[name]}{numbers}.", severity="warning",
                        markup=False)

    def get_system_commands(self, screen: Screen):
        """Textual's, and the chat's that would do something now (as the footer: `_idle`): without a drafter the
        palette listed twenty "Beam W × N" commands that each answered that a beam needs a drafter."""
        yield from super().get_system_commands(screen)
        if not self._idle("new_chat"):
            yield SystemCommand("New chat", "Clear the conversation and its KV cache", self.action_new_chat)
        if not self._idle("copy_reply"):
            yield SystemCommand("Copy last reply", "Send the last reply to the terminal's clipboard (OSC 52)",
                                self.action_copy_reply)
        if not self._idle("toggle_speculative"):
            yield SystemCommand("Toggle speculative decoding", "ReDrafter on/off, live", self.action_toggle_speculative)
        if self.status != "load failed":
            yield SystemCommand("Adaptive drafting", "Size each step's draft to this machine (the default)",
                                self.action_adaptive)
        if not self._idle("beam"):
            for w in (1, 2, 4, 8):
                for n in (2, 3, 4, 5, 6):
                    set_it = lambda w=w, n=n: self.set_beam(w, n)  # noqa: E731
                    yield SystemCommand(f"Beam {w} × {n}", "Set beam width × length", set_it)
        # /seed and /details, in /help's words (the palette had neither): a seed where replies are sampled, "Seed off"
        # where one is fixed, the last reply's seed to fix (/seed N, N typed from it), /details after a cut error
        if self.status != "load failed" and self.settings.temperature > 0:
            last = self.stats.seed if self.stats is not None else None
            yield SystemCommand("Seed", "The last reply's seed (/seed)", self.show_seed)
            if last is not None and last != self.settings.seed:
                yield SystemCommand(f"Seed {last}", f"Every reply drawn with seed {last} (the last reply's), as "
                                    f"--seed {last} (/seed {last})", lambda: self.set_seed(last))
            if self.settings.seed is not None:
                yield SystemCommand("Seed off", "A fresh seed for each reply (/seed off)", lambda: self.set_seed(None))
        if self.error_details is not None:
            yield SystemCommand("Details", "A failed reply's whole error (/details)", self.action_details)
        yield SystemCommand("Stats panel", "Show or hide the live stats (F2)", self.action_toggle_stats)
        yield SystemCommand("Keys and commands", "Show help in the transcript", self.action_help)

    def on_unmount(self):
        if self._cancel is not None:
            self._cancel.set()
        self.engine.close()


def create_app(engine, settings: Optional[Settings] = None) -> ChatApp:
    """The chat app around an engine (app.engine.Engine, FakeEngine, or anything with their methods)."""
    return ChatApp(engine, settings)
