"""The chat app (app/), driven through Textual's pilot with the scripted FakeEngine.

Covers sending and streaming, cancelling mid-reply (text kept, conversation consistent),
new chat, live speculative toggle and beam changes, prompt history, copy, the stats panel's
figures, load errors and the missing-drafter notice; snapshots of the idle and finished
screens; and one short reply from the real default model (its weights must be cached or
fetchable: set REDRAFTER_CACHE).
"""

import sys
import threading
import time
from dataclasses import replace

import pytest

from app.__main__ import configure_parser
from app.app import HELP, ChatApp, create_app
from app.engine import Engine, EngineError, FakeEngine, Settings, Stats
from app.messages import ReplyStatus
from app.widgets import AssistantMessage, LoadStatus, Notice, PromptInput, StatsPanel, UserMessage

SIZE = (120, 40)
REPLY = "Speculative decoding drafts **several** tokens and verifies them in *one* pass of the base model."


async def wait_for(pilot, condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def ready(pilot):
    await wait_for(pilot, lambda: pilot.app.ready)
    await pilot.pause()


async def ask(pilot, text):
    pilot.app.query_one(PromptInput).value = text
    await pilot.press("enter")


async def streaming(pilot, text):
    """Ask `text` once the model is ready, and wait until the reply has begun to stream."""
    await ready(pilot)
    await ask(pilot, text)
    await wait_for(pilot, lambda: pilot.app.generating and transcript_replies(pilot.app) != [""])


async def paste(pilot, text) -> str:
    """Paste `text` into the prompt box as a terminal does; the box's value after it."""
    from textual import events

    box = pilot.app.query_one(PromptInput)
    box.post_message(events.Paste(text))
    await pilot.pause()
    return box.value


async def finished(pilot):
    await wait_for(pilot, lambda: pilot.app.status not in ("generating", "cancelling"))
    await pilot.pause()


def panel(app: ChatApp) -> str:
    return app.query_one(StatsPanel).plain


def transcript_replies(app: ChatApp):
    return [w.text for w in app.query(AssistantMessage)]


async def test_send_streams_a_markdown_reply_and_keeps_the_conversation():
    engine = FakeEngine([REPLY, "Second answer."])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "What is speculative decoding?")
        await finished(pilot)
        assert [w.render().plain for w in app.query(UserMessage)] == ["What is speculative decoding?"]
        assert transcript_replies(app) == [REPLY]
        assert app.query_one(AssistantMessage).source == REPLY  # rendered as Markdown
        assert app.query_one(PromptInput).value == ""
        await ask(pilot, "And then?")
        await finished(pilot)
        assert app.messages == [
            {"role": "user", "content": "What is speculative decoding?"},
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": "Second answer."},
        ]
        # each reply got the whole conversation so far
        assert [len(msgs) for msgs, _ in engine.calls] == [1, 3]


async def test_stats_panel_after_a_speculative_reply():
    app = create_app(FakeEngine([REPLY]), Settings(beam_width=3, beam_length=4, adaptive=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        await finished(pilot)
        text = panel(app)
        # 15 tokens: 1 from prefill, then steps of 3, 1, 2, 4, 2, 2 (scripted) at 0.06 s each
        assert "tok/s        38.9" in text
        assert "tokens/step  2 last · 2.33 mean" in text
        assert "acceptance   44% (8 drafts accepted)" in text
        assert "speedup      1.94×\n  vs plain   20.0 tok/s (warm-up run)" in text
        assert "decoding     speculative 3×4" in text
        assert "draft/verify 20% / 80% of decode" in text
        assert "accepted     ▆▁▃█▃▃" in text  # drafts accepted per step, scaled to the beam length (L - 1)
        assert "  2 tok      ████████████████ 3\n  3 tok      █████ 1" in text
        assert "peak memory  512 MB" in text
        assert "prefill      0.05 s · 5 tokens" in text
        for row in ("model        fake-135m", "drafter      fake-drafter", "weights      float32 (stored 4-bit g32)",
                    "device       cpu (fake)", "beam         3 × 4 (width × length)", "status       done (eos)"):
            assert row in text



def test_the_accepted_sparkline_keeps_one_scale_and_puts_plain_steps_at_the_bottom():
    """The sparkline was scaled to its last 24 steps where a reply has no beam length (adaptive, the default):
    24 plain steps (1 token each, nothing accepted) drew full bars, as if every draft had been accepted,
    and one longer step in the window shrank the rest. It shows the drafts each step accepted, on one scale
    for the whole reply."""
    from app.stats_view import Baseline, as_text, reply_rows

    def line(**stats):
        rows = as_text(reply_rows(Stats(steps=len(stats["accepted_lengths"]), **stats), Baseline(), "done"))
        return next(r for r in rows.splitlines() if r.startswith("accepted "))[13:]

    parked = (5,) + (1,) * 24  # adaptive: one step of 5 tokens, then 24 plain ones
    assert line(mode="auto", accepted_lengths=parked) == "▁" * 24
    assert line(mode="auto", accepted_lengths=(1,) * 30) == "▁" * 24  # nothing ever accepted
    assert line(mode="auto", accepted_lengths=(5, 1, 3)) == "█▁▅"
    assert line(mode="redrafter", beam_length=4, accepted_lengths=(1, 4, 2)) == "▁█▃"


def test_the_histogram_rows_past_the_beam_are_the_lengths_that_occurred():
    """A copied run (lookup, the context graph) makes steps of up to 4 x lookup + 1 tokens: the histogram had
    a row for every length up to the longest, 33 rows for one step of 33, most of them "· 0", which pushed
    the rest of the panel out of sight. Rows run to the beam length, then only lengths that occurred."""
    from app.stats_view import Baseline, as_text, reply_rows

    def rows(**stats):
        text = as_text(reply_rows(Stats(steps=len(stats["accepted_lengths"]), **stats), Baseline(), "done"))
        return [r.split()[0] for r in text.splitlines() if r.endswith(tuple("0123456789")) and " tok " in r]

    assert rows(mode="redrafter", beam_length=4, accepted_lengths=(1, 33, 2, 9)) == ["1", "2", "3", "4", "9", "33"]
    assert rows(mode="auto", accepted_lengths=(1, 3, 1, 17)) == ["1", "3", "17"]

async def test_tuned_beam_shape_is_the_default_unless_given():
    app = create_app(FakeEngine([REPLY], beam_shape=(2, 6)), Settings())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (app.settings.beam_width, app.settings.beam_length) == (2, 6)
        assert "beam         adaptive (sized each step to this machine)" in panel(app)
        assert app.settings.tree is None and app.settings.adaptive
        await pilot.press("f6")  # a fixed beam starts from the tuned shape
        assert "beam         3 × 6 (width × length)" in panel(app) and not app.settings.adaptive
    app = create_app(FakeEngine([REPLY], beam_shape=(4, 7), tree=12), Settings())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (app.settings.beam_width, app.settings.beam_length, app.settings.tree) == (4, 7, 12)
        await ask(pilot, "/width 4")
        assert "4 × 7 (width × length), tree of 12 nodes" in panel(app)
    app = create_app(FakeEngine([REPLY], beam_shape=(2, 6), tree=12),
                     Settings(beam_width=3, beam_length=4, beam_tuned=False, adaptive=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (app.settings.beam_width, app.settings.beam_length) == (3, 4) and app.settings.tree is None


PARTLY_GIVEN = [["-W", "2"], ["-L", "3"], ["-W", "2", "--tree", "6"], ["-L", "3", "--lookup", "5"], ["-W", "2", "-L", "3"]]


# (the whole tuned shape with W=1 L=1 is not adopted: test_adaptive_by_default_even_where_plain_decoding_was_tuned_fastest)
@pytest.mark.parametrize("argv,tuned", [(a, (3, 5)) for a in PARTLY_GIVEN + [["--lookup", "5"]]]
                         + [(a, (2, 1)) for a in PARTLY_GIVEN])
async def test_a_partly_given_beam_takes_the_tuned_rest_as_the_library_does(argv, tuned):
    """`redrafter-chat -W 2` drafted 2 x 4 where the help says the length defaults to the tuned one,
    and `python -m redrafter_mlx --beam-width 2` drafted 2 x 5 (tuned 3 x 5): the chat now fills in
    what was not given as tuning.drafting does for the library (the tuned tree only with the whole
    tuned shape; a tuned length of 1 names none to draft with)."""
    from types import SimpleNamespace

    from app.__main__ import settings_from
    from redrafter_mlx.tuning import drafting

    args = configure_parser().parse_args(argv)
    app = create_app(FakeEngine([REPLY], beam_shape=tuned, tree=12), settings_from(args))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.settings
        want = drafting(SimpleNamespace(beam_shape=tuned, tree=12), args.beam_width, args.beam_length, args.tree)
        assert not s.adaptive and (s.beam_width, s.beam_length, s.tree or 0) == want[:3]


async def test_adaptive_by_default_even_where_plain_decoding_was_tuned_fastest():
    """--tune's W=1 L=1 (plain decoding fastest) no longer turns speculation off: the adaptive
    controller parks by itself where drafting does not pay. The panel shows what it chose."""
    engine = FakeEngine([REPLY], beam_shape=(1, 1))
    app = create_app(engine, Settings())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.settings.speculative is True and app.settings.adaptive
        assert (app.settings.beam_width, app.settings.beam_length) == (Settings().beam_width, Settings().beam_length)
        await ask(pilot, "Explain.")
        await finished(pilot)
        text = panel(app)
        assert "decoding     adaptive · 0% of steps parked (plain)" in text
        assert "cost model   plain 50 ms · 16 tokens 1.6× · 64 3.0×" in text
        assert engine.calls[-1][1].adaptive
        await pilot.press("f5")
        assert not app.settings.adaptive
        await ask(pilot, "/auto")
        assert app.settings.adaptive


async def test_redraws_are_coalesced_while_streaming(monkeypatch):
    """Chunks faster than UPDATE_SECONDS are drawn together (redraws cost decoding speed), and the
    newest one is still drawn while the reply runs; the final text is whole.

    (It streamed a whole reply and asked for 2 to chunks/3 redraws: the reply ended within one
    UPDATE_SECONDS, so a timer that drew the first chunk and never a later one passed as well as one that
    did, and a reply slowed past 4 s by a loaded machine would have been refused for the redraws its length
    allowed. The reply now waits twice: the newest chunk must reach the screen while it waits; and the
    redraws are held to what the reply's own duration allows, one each UPDATE_SECONDS and the final one.)"""
    import app.app as app_module

    every = 0.5
    monkeypatch.setattr(app_module, "UPDATE_SECONDS", every)
    shown = []
    original = AssistantMessage.show

    async def counting_show(self, text):
        shown.append(text)
        await original(self, text)

    monkeypatch.setattr(AssistantMessage, "show", counting_show)
    waits, sent = {6: threading.Event(), 12: threading.Event()}, []  # the reply waits before chunks 6 and 12
    whole = " ".join([REPLY] * 3)
    engine = FakeEngine([whole], step_delay=0.01)  # (chunks apart, each one a message: Textual merges a burst)
    held = engine._reply

    def waiting(messages, settings, should_stop, on_status=None):
        for n, chunk in enumerate(held(messages, settings, should_stop, on_status)):
            if n in waits:
                waits[n].wait(60)
            sent.append(chunk.text)
            yield chunk

    engine._reply = waiting
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        try:
            await ready(pilot)
            began = time.monotonic()
            await ask(pilot, "Explain.")
            for n, release in waits.items():
                await wait_for(pilot, lambda: len(sent) == n and app.reply_view is not None
                               and app.reply_view.text == "".join(sent))
                assert app.generating, n  # the newest chunk drawn while the reply runs
                release.set()
        finally:
            for release in waits.values():
                release.set()
        await finished(pilot)
        took = time.monotonic() - began
        assert transcript_replies(app) == [whole]
    # a redraw at once, then at most one each UPDATE_SECONDS, and the final text: however long the reply took
    assert 3 <= len(shown) <= 2 + took / every, (len(shown), len(sent), took)


async def test_stats_panel_updates_while_generating():
    engine = FakeEngine([REPLY], hold_after=3)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        await wait_for(pilot, lambda: "tokens/step  1 last" in panel(app))
        assert "status       generating…" in panel(app)
        await pilot.press("escape")
        await finished(pilot)


async def test_cancel_mid_reply_keeps_the_streamed_text_and_the_conversation():
    engine = FakeEngine([REPLY, "Next."], hold_after=3)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        partial = "Speculative decoding drafts **several** tokens "  # the prefill token, steps of 3 and 1
        await wait_for(pilot, lambda: transcript_replies(app) == [partial])
        assert app.generating
        await pilot.press("escape")
        await finished(pilot)
        assert app.status == "cancelled"
        assert transcript_replies(app) == [partial]
        assert app.query_one(AssistantMessage).border_subtitle == "cancelled"
        assert app.messages[-1] == {"role": "assistant", "content": partial}
        assert "status       cancelled" in panel(app)
        # the next turn builds on exactly what was shown
        engine.hold_after = None
        await ask(pilot, "Go on.")
        await finished(pilot)
        sent, _ = engine.calls[-1]
        assert sent == [
            {"role": "user", "content": "Explain."},
            {"role": "assistant", "content": partial},
            {"role": "user", "content": "Go on."},
        ]


async def test_a_redraw_due_after_the_app_is_torn_down_draws_nothing():
    """Quitting while a reply streamed, the timer's redraw of the newest progress (`_draw_pending`) could run
    after the widgets were gone (2 exits in 8): its `NoMatches: StatsPanel` ended the chat with a traceback. A
    redraw due then, or one whose drawing the teardown overtook, draws nothing."""
    import asyncio

    from app.messages import ReplyProgress

    app = create_app(FakeEngine([REPLY], hold_after=3))
    async with app.run_test(size=SIZE) as pilot:
        await streaming(pilot, "Explain.")
        view, text = app.reply_view, app.reply_view.text
        drawn, shown = asyncio.Event(), view.show

        async def slow_show(new_text):  # the drawing still under way when the app goes
            await drawn.wait()
            await shown(new_text)

        view.show = slow_show
        app._pending = ReplyProgress(app.reply_id, text + "drafted ", app.stats, None)
        overtaken = asyncio.ensure_future(app._draw_pending())
        await pilot.pause()
    assert not app.query(StatsPanel) and app.reply_view is view  # torn down mid-reply
    drawn.set()
    await overtaken  # (raised NoMatches)
    view.show = shown
    app._pending = ReplyProgress(app.reply_id, text + "drafted tokens ", app.stats, None)
    await app._draw_pending()  # due after the teardown (raised NoMatches)
    assert app._pending is None and not view.text.endswith("drafted tokens ")  # nothing drawn


async def test_ctrl_c_cancels_and_sending_while_generating_is_refused():
    engine = FakeEngine([REPLY], hold_after=2)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await streaming(pilot, "Explain.")
        await ask(pilot, "Another?")
        assert len(engine.calls) == 1 and app.query_one(PromptInput).value == "Another?"
        await pilot.press("ctrl+c")
        await finished(pilot)
        assert app.status == "cancelled" and len(app.messages) == 2


async def test_ctrl_c_with_nothing_to_cancel_says_how_to_quit():
    """Ctrl+C with no reply running and nothing selected did nothing, silently: the chat's Ctrl+C (cancel)
    replaced Textual's own, which tells a user quitting by reflex that Ctrl+Q quits. It says so; with text
    selected in the prompt box it still copies it."""
    app = create_app(FakeEngine(["x"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+c")
        assert [str(n.message) for n in app._notifications] == \
            ["Nothing to cancel: Ctrl+Q quits (Ctrl+C copies selected text)."]
        box = app.query_one(PromptInput)
        box.value = "some text"
        await pilot.press("shift+home")
        await pilot.press("ctrl+c")
        assert app.clipboard == "some text" and len(app._notifications) == 1


async def test_ctrl_c_with_text_selected_copies_it_and_the_reply_goes_on():
    """Ctrl+C during a reply cancelled it even with text selected: a user copying part of a streaming reply (or
    of the prompt box) stopped it. With a selection it copies that, says so, and the reply goes on; without one
    it cancels."""
    from textual.selection import Selection

    engine = FakeEngine([REPLY], hold_after=2)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await streaming(pilot, "Explain speculative decoding.")
        app.screen.selections = {app.query_one(UserMessage): Selection(None, None)}  # (as a mouse drag selects)
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.clipboard == "Explain speculative decoding." and app.status == "generating"
        assert "Sent the selected text (29 characters)" in str(list(app._notifications)[-1].message)
        app.screen.clear_selection()
        box = app.query_one(PromptInput)
        box.value = "typed meanwhile"
        await pilot.press("end", "shift+home", "ctrl+c")
        await pilot.pause()
        assert app.clipboard == "typed meanwhile" and app.status == "generating"
        await pilot.press("end", "ctrl+c")  # nothing selected: it cancels
        await finished(pilot)
        assert app.status == "cancelled"


async def test_sending_while_a_reply_is_being_cancelled_says_so():
    """Enter while a cancelled reply was still stopping (a long prompt's chunk, a step) said "Esc cancels
    it", a key already pressed; it says the reply is being cancelled, and the message stays in the box."""
    stopped = threading.Event()  # the reply sees its stop flag only once the test says so

    class SlowToStop(FakeEngine):
        def reply(self, messages, settings, should_stop, on_status=None):
            return super().reply(messages, settings, lambda: should_stop() and stopped.is_set(), on_status)

    engine = SlowToStop([REPLY], hold_after=2)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Long answer please")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text)
        await pilot.press("escape")
        await ask(pilot, "Next question")
        await pilot.pause()
        said = str(list(app._notifications)[-1].message)
        stopped.set()  # (first: a failed assertion left the app waiting on the reply)
        assert said.startswith("The reply is being cancelled")
        assert app.query_one(PromptInput).value == "Next question"
        await finished(pilot)
        assert app.status == "cancelled" and len(engine.calls) == 1


async def test_an_empty_reply_says_so():
    """A reply of no text (a model that ends its turn at once, or only spaces) showed an empty bubble
    with no word; it says "empty reply", and the turn stays in the conversation as the model gave it."""
    app = create_app(FakeEngine(["", "   ", "Words."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for question in ("one", "two", "three"):
            await ask(pilot, question)
            await finished(pilot)
        assert [w.border_subtitle for w in app.query(AssistantMessage)] == ["empty reply", "empty reply", ""]
        assert [m["content"] for m in app.messages if m["role"] == "assistant"] == ["", "   ", "Words."]


async def test_new_chat_clears_the_conversation_and_the_engine_cache():
    engine = FakeEngine([REPLY])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        await finished(pilot)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.messages == []
        assert not app.query(AssistantMessage) and not app.query(UserMessage)
        await ask(pilot, "Fresh start.")
        await finished(pilot)
        assert engine.new_chats == 1
        assert engine.calls[-1][0] == [{"role": "user", "content": "Fresh start."}]


async def test_new_chat_during_a_reply_cancels_it_first():
    engine = FakeEngine([REPLY], hold_after=2)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        await wait_for(pilot, lambda: app.generating)
        await ask(pilot, "/new")
        await finished(pilot)
        await wait_for(pilot, lambda: engine.new_chats == 1)
        assert app.messages == [] and not app.query(AssistantMessage)


async def test_clear_quit_and_exit_are_commands_as_in_other_terminal_chats():
    """/clear, /quit and /exit, what other terminal chats take, answered "Unknown command": /clear starts a new chat
    as /new does, /quit and /exit quit as Ctrl+Q does (a reply running is cancelled: ChatApp.on_unmount)."""
    engine = FakeEngine(["One.", "Two."])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Hello")
        await finished(pilot)
        await ask(pilot, "/clear")
        await wait_for(pilot, lambda: engine.new_chats == 1)
        assert app.messages == [] and not app.query(AssistantMessage)
        assert str(app.query(Notice).last().render()) == "New chat."
        await ask(pilot, "/clear all")
        assert str(list(app._notifications)[-1].message) == "'/clear all': /clear is written /clear."
        assert not app._exit
    for command in ("/quit", "/exit", " /QUIT"):
        app = create_app(FakeEngine(["x"]))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await ask(pilot, command)
            await pilot.pause()
            assert app._exit and app.return_code == 0, command
    assert "/new (or /clear)" in HELP and "/quit (or /exit)" in HELP


async def test_new_chat_while_a_reply_is_cancelled_before_a_word_leaves_the_box_empty():
    """Ctrl+N while a reply was being cancelled before its first word put the withdrawn message back into the
    new chat's prompt box, as if to send it again in a chat the user had just asked to start afresh."""
    engine = FakeEngine(["x"], hold_after=0)
    stop_seen, held = threading.Event(), engine._reply
    engine._reply = lambda m, s, should_stop, on_status=None: held(m, s, lambda: stop_seen.is_set() and should_stop(),
                                                                    on_status)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Explain.")
        await wait_for(pilot, lambda: app.generating)
        await pilot.press("escape")
        assert app.status == "cancelling"
        await pilot.press("ctrl+n")
        stop_seen.set()  # the cancel ends after Ctrl+N
        await finished(pilot)
        await wait_for(pilot, lambda: engine.new_chats == 1)
        assert app.messages == [] and not app.query(UserMessage) and app.query_one(PromptInput).value == ""


async def test_toggle_speculative_and_change_the_beam_live():
    engine = FakeEngine(["One two three four five six seven."])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")
        assert "speculative  off" in panel(app)
        await ask(pilot, "Plain please.")
        await finished(pilot)
        assert engine.calls[-1][1].speculative is False
        assert "decoding     plain" in panel(app)
        assert "speedup      1.00× (plain decoding)" in panel(app)
        assert "acceptance   —" in panel(app)
        await pilot.press("ctrl+t", "f6", "f6", "f7")
        assert "beam         6 × 3 (width × length)" in panel(app)
        await ask(pilot, "/beam 3×4")  # as the panel writes it
        assert (app.settings.beam_width, app.settings.beam_length) == (3, 4)
        await ask(pilot, "/beam 2x5")
        assert (app.settings.beam_width, app.settings.beam_length) == (2, 5)
        await ask(pilot, "Fast please.")
        await finished(pilot)
        s = engine.calls[-1][1]
        assert (s.speculative, s.beam_width, s.beam_length) == (True, 2, 5)
        assert "decoding     speculative 2×5" in panel(app)
        # the plain reply (6 steps) replaced the calibration as the speedup baseline
        assert "  vs plain   20.0 tok/s (1 plain reply)" in panel(app)


async def test_a_drafting_change_while_speculation_is_off_says_it_is_off():
    """F5-F8, /beam and /auto with speculative decoding off answered "Beam: 5 × 4, fixed" and the replies went
    on decoding plainly; the notice says speculation is off and how to turn it on."""
    engine = FakeEngine([REPLY])
    app = create_app(engine, Settings(speculative=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f6")
        await ask(pilot, "/auto")
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert said[0].startswith("Beam: 5 × 4") and said[1].startswith("Adaptive drafting")
        assert all(line.endswith("Speculative decoding is off: Ctrl+T turns it on.") for line in said)
        await pilot.press("ctrl+t")
        await pilot.press("f6")
        # (F6 saying nothing passed too: the last notice was then Ctrl+T's "Speculative decoding on.")
        last = str(list(app._notifications)[-1].message)
        assert last.startswith("Beam: 6 × 4") and "Speculative decoding is off" not in last, last


LONG_REPLY = " ".join(f"word{i}" + ("\n\n" if i % 20 == 0 else "") for i in range(400))  # taller than the screen


async def long_reply_read(pilot, app):
    """Ask, let the engine's first reply (LONG_REPLY) finish, and wait until the transcript follows it to its end;
    returns the transcript."""
    from app.widgets import Transcript

    await ready(pilot)
    await ask(pilot, "Go on.")
    await finished(pilot)
    transcript = app.query_one(Transcript)
    await wait_for(pilot, lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y)
    return transcript


async def test_page_keys_scroll_the_conversation_from_the_prompt_box():
    """PgUp/PgDn did nothing with the focus in the prompt box (where it always is: a one-line box has no page to
    turn), so a long reply could be read back by keyboard only after Tab moved the focus to the transcript."""
    app = create_app(FakeEngine([LONG_REPLY]), Settings(max_tokens=1000))
    async with app.run_test(size=SIZE) as pilot:
        transcript = await long_reply_read(pilot, app)
        assert app.focused is app.query_one(PromptInput)
        await pilot.press("pageup")
        await wait_for(pilot, lambda: transcript.scroll_y < transcript.max_scroll_y)
        await pilot.press("pagedown", "pagedown")
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y)
        assert "PgUp/PgDn scroll the conversation" in configure_parser().format_help()


async def test_sending_a_message_scrolls_back_to_the_end_and_follows_the_reply():
    """Scrolled up to read back (PgUp, the wheel), the transcript stayed there when a message was sent: the
    message and its streaming reply were out of sight until the user scrolled down by hand."""
    app = create_app(FakeEngine([LONG_REPLY, "x", LONG_REPLY]), Settings(max_tokens=1000))
    async with app.run_test(size=SIZE) as pilot:
        transcript = await long_reply_read(pilot, app)
        await pilot.press("pageup", "pageup", "pageup")
        await wait_for(pilot, lambda: transcript.scroll_y == 0)
        await ask(pilot, "Short one.")
        await finished(pilot)
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y)
        transcript.scroll_home(animate=False)  # (the wheel)
        await wait_for(pilot, lambda: transcript.scroll_y == 0)
        await ask(pilot, "A long one.")  # followed while it streams, to its end
        await finished(pilot)
        await pilot.pause(0.2)
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y)
        transcript.scroll_home(animate=False)
        await wait_for(pilot, lambda: transcript.scroll_y == 0)
        await ask(pilot, "/help")  # what the chat says comes into sight too
        await wait_for(pilot, lambda: transcript.scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y)


async def test_a_click_on_the_conversation_leaves_the_typing_in_the_prompt_box():
    """A click on a reply (to select its text, or by chance) moved the focus to the transcript, and the message
    typed next went nowhere, silently: the transcript never takes the focus."""
    from app.widgets import Transcript

    app = create_app(FakeEngine(["A reply with some words."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Hi.")
        await finished(pilot)
        await pilot.click(Transcript, offset=(5, 3))
        await pilot.press("o", "k")
        assert app.query_one(PromptInput).value == "ok"
        await pilot.press("tab")  # (nothing else to move to)
        assert app.focused is app.query_one(PromptInput)


async def test_prompt_history_and_copy():
    app = create_app(FakeEngine(["First.", "Second."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two"):
            await ask(pilot, text)
            await finished(pilot)
        prompt = app.query_one(PromptInput)
        prompt.value = "draft"
        await pilot.press("up")
        assert prompt.value == "two"
        await pilot.press("up", "up")
        assert prompt.value == "one"
        await pilot.press("down", "down")
        assert prompt.value == "draft"
        await pilot.press("ctrl+y")
        assert app.clipboard == "Second."
        # Textual writes OSC 52 and cannot tell whether the terminal took it: "Copied" was said where it did not
        said = str(list(app._notifications)[-1].message)
        assert said.startswith("Sent the last reply (7 characters) to the terminal's clipboard (OSC 52: some terminals")


async def test_copy_while_a_reply_runs_copies_that_reply_so_far():
    """Ctrl+Y during a reply copied the reply before it, saying "Copied the last reply": it copies the
    running reply's text so far and says so, or that there is nothing yet before its first word."""
    engine = FakeEngine(["First.", REPLY, "x"], hold_after=3)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine.hold_after = None
        await ask(pilot, "one")
        await finished(pilot)
        engine.hold_after = 3
        await ask(pilot, "Explain.")
        partial = "Speculative decoding drafts **several** tokens "
        await wait_for(pilot, lambda: transcript_replies(app)[-1:] == [partial])
        await pilot.press("ctrl+y")
        assert app.clipboard == partial
        assert str(list(app._notifications)[-1].message) == f"Sent the reply so far ({len(partial)} characters; " \
            "it is still running) to the terminal's clipboard (OSC 52: some terminals ignore it, macOS Terminal among them)."
        await pilot.press("escape")
        await finished(pilot)
        engine.hold_after = 0  # held before its first word
        await ask(pilot, "again")
        await wait_for(pilot, lambda: app.generating)
        await pilot.press("ctrl+y")
        assert app.clipboard == partial
        assert str(list(app._notifications)[-1].message) == "Nothing to copy yet: the reply has not begun."
        await pilot.press("escape")
        await finished(pilot)


async def test_missing_drafter_means_plain_decoding_with_a_notice():
    engine = FakeEngine(["Plain."], drafter=None)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        notices = [str(n.render()) for n in app.query(Notice) if "-warning" in n.classes]
        assert any("No drafter found" in n for n in notices)
        assert "speculative  on (context lookup only: no drafter)" in panel(app)
        assert "drafter      none: context lookup or plain decoding" in panel(app)
        await pilot.press("ctrl+t")
        assert not app.settings.speculative and "speculative  off" in panel(app)
        await ask(pilot, "Hi")
        await finished(pilot)
        assert "decoding     plain" in panel(app)


def footer_keys(app: ChatApp):
    """The keys the footer shows (its widgets: it redraws only when told the bindings changed), less Ctrl+P."""
    return {key.key for key in app.query("FooterKey")} - {"ctrl+p"}


async def test_without_a_drafter_the_footer_leaves_out_the_beam_keys_which_still_say_why():
    """With no drafter the footer showed F5-F8 (Width−/Width+/Length−/Length+), which can set no beam: they are
    out of it now, and pressing one still says why the beam stays as it was."""
    app = create_app(FakeEngine(["Plain."], drafter=None))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        shown = footer_keys(app)
        assert {"ctrl+n", "ctrl+y", "ctrl+t", "ctrl+q"} <= shown and not shown & {"f5", "f6", "f7", "f8"}
        before = replace(app.settings)
        for key in ("f5", "f6", "f7", "f8"):
            await pilot.press(key)
        said = [str(n.message) for n in app._notifications]
        assert len(said) == 4 and all(line.startswith("A fixed beam needs a drafter") for line in said)
        assert app.settings == before
        await pilot.press("ctrl+p")  # over the command palette the app's keys do not run, and say nothing
        await wait_for(pilot, lambda: app.screen.is_modal)
        await pilot.press("f5")
        await pilot.pause()
        assert len(app._notifications) == 4
        await pilot.press("escape")
    app = create_app(FakeEngine(["Drafted."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert {"f5", "f6", "f7", "f8"} <= footer_keys(app)


def palette(app: ChatApp):
    return [command.title for command in app.get_system_commands(app.screen)]


async def test_the_footer_fits_an_80_column_terminal():
    """At 80 columns (macOS Terminal's default window) the footer ended at "f6 Width+": F7/F8 (the beam length)
    were out of sight, under the command palette's key. F5/F6 and F7/F8 show under one label each now. While a
    reply streamed (and while a message waited for the model) "esc Cancel" pushed them out again, the footer
    ending "f5 f6 Width f": every key fits in each of those states."""

    async def fits(pilot, *shown):
        await pilot.pause()
        keys = {key.key: key for key in pilot.app.query("FooterKey")}
        assert set(shown) | {"ctrl+q", "ctrl+t", "f5", "f6", "f7", "f8", "ctrl+p"} <= set(keys)
        edge = keys["ctrl+p"].region.x  # (the palette's key, at the right)
        assert [name for name, key in keys.items() if name != "ctrl+p" and key.region.right > edge] == []
        assert all(label.region.right <= edge for label in pilot.app.query("FooterLabel"))
        assert [str(label.render()).strip() for label in pilot.app.query("FooterLabel")] == ["Width", "Length"]

    app = create_app(FakeEngine([REPLY], hold_after=3))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await fits(pilot, "ctrl+n", "ctrl+y")
        await streaming(pilot, "Explain.")
        await fits(pilot, "escape", "ctrl+n", "ctrl+y")
        await pilot.press("escape")
        await finished(pilot)
    gate = threading.Event()
    app = create_app(FakeEngine(["x"], load_gate=gate))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await ask(pilot, "Hello?")  # waits for the model
            assert app._queued == "Hello?"
            await fits(pilot, "escape", "ctrl+n")
    finally:
        gate.set()


def test_a_prompt_given_on_the_command_line_is_said_to_be_typed_in_the_chat(capsys):
    """`redrafter-chat "What is MLX?"` (as `python -m redrafter_mlx PROMPT` takes one) said "unrecognized arguments:
    What is MLX?", which read as a bad option: it says the chat takes no prompt there, and where one goes."""
    from app.__main__ import main

    for argv in (["What is MLX?"], ["--temperature", "0.7", "What", "is", "MLX?"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("redrafter-chat: error: the chat takes no prompt on its command line ('What is MLX?'): "
                              "type it once the chat opens; python -m redrafter_mlx PROMPT answers one"), err
    with pytest.raises(SystemExit):
        main(["--modle", "x"])  # an unknown option stays one
    assert "error: unrecognized arguments: --modle x (options: redrafter-chat --help)" in capsys.readouterr().err


def test_ctrl_c_before_the_screen_opens_ends_with_one_line(capsys, monkeypatch):
    """The seconds before the chat's screen opens go into importing the library (MLX) and Textual: Ctrl+C then
    printed a KeyboardInterrupt traceback of 30-odd lines from inside those imports (and the shell's status for
    SIGINT). It says "cancelled" on a line of its own, status 130, as the other commands do."""
    import app.__main__ as chat_main

    def importing(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(chat_main, "refusal", importing)
    try:
        status = chat_main.main([])
    except KeyboardInterrupt:  # (a failure, not pytest's own Ctrl+C, which ends the whole run)
        pytest.fail("Ctrl+C before the screen opened ended the chat with a traceback")
    assert status == 130
    assert capsys.readouterr().err == "\nredrafter-chat: cancelled\n"


def test_help_fits_an_80_column_terminal(monkeypatch):
    """argparse wraps the options' help to the terminal, not the description and the examples (kept as written):
    the description was one line of 148 characters and eleven lines of the examples ran past 80 columns (macOS
    Terminal's default window), each broken mid-word by the terminal. Every line fits, and every example
    command parses."""
    import shlex

    from app.__main__ import EXAMPLES

    monkeypatch.setenv("COLUMNS", "80")
    text = configure_parser().format_help()
    assert [line for line in text.splitlines() if len(line) > 79] == []
    commands = [line.split(None, 1) for line in EXAMPLES.splitlines() if line.startswith("  redrafter-chat")]
    assert len(commands) == 5
    for _, *options in commands:
        configure_parser().parse_args(shlex.split(options[0]) if options else [])


async def test_the_command_palette_lists_only_what_would_do_something():
    """Ctrl+P listed twenty "Beam W × N" commands over a model with no drafter, each answering that a beam needs
    one, and every chat command after a failed load: they are left out where they would do nothing."""
    app = create_app(FakeEngine(["x"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "Beam 4 × 4" in palette(app) and "New chat" in palette(app)
    app = create_app(FakeEngine(["x"], drafter=None))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        listed = palette(app)
        assert not any(title.startswith("Beam") for title in listed)
        assert {"New chat", "Copy last reply", "Toggle speculative decoding", "Adaptive drafting"} <= set(listed)
    app = create_app(FakeEngine(fail_load="no such model"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        listed = palette(app)
        assert "Quit" in listed
        assert not {"New chat", "Copy last reply", "Toggle speculative decoding", "Adaptive drafting"} & set(listed)
        assert not any(title.startswith("Beam") for title in listed)


async def choose(pilot, text):
    """Choose a command in the command palette (Ctrl+P) as a user does: type `text`, Enter on the first hit."""
    from textual.command import CommandList

    app = pilot.app
    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: app.screen.is_modal)
    await pilot.press(*("space" if c == " " else c for c in text))
    hits = app.screen.query_one(CommandList)
    await wait_for(pilot, lambda: hits.option_count and hits.highlighted is not None)
    await pilot.pause(0.2)  # (the search runs in the background: its last hits)
    first = str(hits.get_option_at_index(hits.highlighted).prompt).split("\n")[0]
    await pilot.press("enter")
    await wait_for(pilot, lambda: not app.screen.is_modal)
    await pilot.pause()
    return first


async def test_the_command_palette_has_seed_and_details_as_their_slash_commands_do():
    """/seed and /details were not in the command palette, which Ctrl+P in the footer and /help offer as "all
    commands": they are, in /help's words, where they would do something (a seed where replies are sampled, "Seed
    off" where one is fixed, the last reply's seed to fix; the whole error after a failed reply's cut one)."""
    from app.engine import FAKE_SEED

    def said(app):
        return str(list(app._notifications)[-1].message)

    app = create_app(FakeEngine(["One.", "Two."]), Settings(temperature=0.7))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "Seed" in palette(app) and not {"Seed off", f"Seed {FAKE_SEED}", "Details"} & set(palette(app))
        await ask(pilot, "first")
        await finished(pilot)
        assert await choose(pilot, "seed") == "Seed"
        assert said(app).startswith(f"The last reply was drawn with seed {FAKE_SEED}: /seed {FAKE_SEED} draws")
        assert await choose(pilot, f"seed {FAKE_SEED}") == f"Seed {FAKE_SEED}"
        assert app.settings.seed == FAKE_SEED and said(app).startswith(f"Seed {FAKE_SEED}: every reply is drawn")
        assert f"Seed {FAKE_SEED}" not in palette(app)  # (fixed already)
        assert await choose(pilot, "seed off") == "Seed off"
        assert app.settings.seed is None and said(app).startswith("Seed off: each reply draws a fresh one")
    app = create_app(FakeEngine(["x"]), Settings())  # greedy: no seed draws a reply
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert not any(title.startswith("Seed") for title in palette(app))
    error = RuntimeError("[metal::malloc] Attempting to allocate 9 GB\nwhich is more than the limit of 8 GB.")
    app = create_app(FakeEngine(["x"], fail_reply=error))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "a question")
        await finished(pilot)
        assert await choose(pilot, "details") == "Details"
        assert str(app.query(Notice).last().render()).endswith(f"in full:\nRuntimeError: {error}")
    assert "/seed (the last reply's seed)" in HELP and "/details (a failed reply's whole error)" in HELP


async def test_a_message_sent_while_loading_is_kept_and_sent_once_ready():
    gate = threading.Event()  # the load ends when the test says so
    engine = FakeEngine(["Ready now."], load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "An early question")
        assert not app.ready and app.query_one(PromptInput).value == ""
        await pilot.pause()
        assert any("sent as soon as it is ready" in str(n.render()) for n in app.query(Notice))
        gate.set()
        await ready(pilot)
        await wait_for(pilot, lambda: engine.calls)
        await finished(pilot)
        assert engine.calls[0][0] == [{"role": "user", "content": "An early question"}]
        assert [w.render().plain for w in app.query(UserMessage)] == ["An early question"]
        assert app.messages[-1] == {"role": "assistant", "content": "Ready now."}


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
async def test_esc_while_loading_cancels_the_waiting_message(key):
    """Esc (or Ctrl+C) on a message sent while the model loaded did nothing, and the message was sent once
    it had loaded; the message is cancelled now, back in the box, and never sent."""
    gate = threading.Event()
    engine = FakeEngine(["Ready now."], load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "An early question⏎second line")
        await pilot.pause()
        await pilot.press(key)
        await pilot.pause()
        assert app.query_one(PromptInput).value == "An early question⏎second line"
        assert any("cancelled, not sent" in str(n.message) for n in app._notifications)
        gate.set()
        await ready(pilot)
        await pilot.pause(0.2)
        assert engine.calls == [] and app.messages == [] and not app.query(UserMessage)


async def test_a_message_queued_during_a_failed_load_is_given_back():
    gate = threading.Event()
    app = create_app(FakeEngine(fail_load="no such model", load_gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "An early question⏎with a second line")
        gate.set()
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.pause()
        # as the box shows a line break (it held a raw "\n" in a one-line box)
        assert app.query_one(PromptInput).value == "An early question⏎with a second line" and app.messages == []


async def test_load_progress_and_a_load_error_are_readable():
    app = create_app(FakeEngine(fail_load="unknown model 'nope': not a known name"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.pause()
        text = str(app.query_one(LoadStatus).render())
        assert " ✓ fetch    fake-135m.gguf (cached)" in text
        assert " ✗ load     loading fake-135m.gguf" in text
        assert "The model did not load: unknown model 'nope': not a known name" in text
        assert "Traceback" not in text
        assert app.query_one(PromptInput).disabled


async def test_a_load_errors_whole_text_is_printed_after_the_chat():
    """A load that failed with an error over several lines (MLX's, a library's) showed its first line, and the line
    printed after the chat closed was that line too: the rest was lost. The screen keeps to the line; the whole
    text is printed where it stays."""
    app = create_app(FakeEngine(fail_load=RuntimeError("[metal] out of memory\n  allocating 2 GB\n  at step 3")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.pause()
        assert "The model did not load: RuntimeError: [metal] out of memory" in str(app.query_one(LoadStatus).render())
        assert "allocating 2 GB" not in str(app.query_one(LoadStatus).render())
    assert app.load_details == "RuntimeError: [metal] out of memory\n  allocating 2 GB\n  at step 3"


async def test_the_stats_panel_says_the_model_did_not_load():
    """After a failed load the panel read "status load failed" above "model loading…"."""
    app = create_app(FakeEngine(fail_load="no such model"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.pause()
        assert "loading" not in panel(app)
        assert "model        did not load (the reason is in the chat)" in panel(app).splitlines()


async def test_setting_keys_after_a_failed_load_say_no_model_is_loaded():
    """Ctrl+T and F5-F8 after a failed load answered "Speculative decoding off." and "Beam: 5 × 4", as if a
    model would use them; they say no model is loaded now, and the settings stay."""
    app = create_app(FakeEngine(fail_load="no such model"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        before = replace(app.settings)
        for key in ("ctrl+t", "f5", "f6", "f7", "f8"):
            await pilot.press(key)
        app.action_adaptive()  # (the command palette's "Adaptive drafting")
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert len(said) == 6 and all(line.startswith("No model is loaded") for line in said)
        assert app.settings == before
        assert footer_keys(app) == {"ctrl+q"}  # (New chat, Copy, Speculative and F5-F8 would do nothing)
        await pilot.press("ctrl+n")  # out of the footer, and still saying why when pressed
        assert str(list(app._notifications)[-1].message) == "Nothing to clear yet: the model did not load."


async def test_real_engine_load_error_is_one_readable_line():
    app = create_app(Engine("no-such-model"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed", timeout=120)
        await pilot.pause()
        text = str(app.query_one(LoadStatus).render())
        assert "The model did not load: unknown model 'no-such-model': not a known name" in text
        assert "Traceback" not in text


async def test_help_says_esc_also_cancels_a_waiting_message():
    """Esc and Ctrl+C also cancel a message waiting for the model to load; /help and --help said "the reply"
    alone."""
    assert "a message waiting for the model to load" in " ".join(configure_parser().format_help().split())
    gate = threading.Event()
    app = create_app(FakeEngine(["x"], load_gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await ask(pilot, "/help")  # (while the model loads)
        await pilot.pause()
        help_text = " ".join(str(app.query(Notice).last().render()).split())
        gate.set()
        await ready(pilot)
        assert "Esc or Ctrl+C cancel the reply, or a message waiting for the model to load" in help_text
        assert "F5/F6 beam width −/+ · F7/F8 beam length −/+" in help_text


async def test_help_without_a_drafter_says_the_beam_keys_need_one():
    """/help listed "F5/F6 beam width −/+ · F7/F8 beam length −/+" and the beam commands over a model with no
    drafter, where each only answers that a beam needs one."""
    app = create_app(FakeEngine(["x"], drafter=None))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "/help")
        await pilot.pause()
        help_text = " ".join(str(app.query(Notice).last().render()).split())
        assert "beam width −/+" not in help_text
        assert "F5-F8 fix a beam: this model has no drafter" in help_text
        assert "(a fixed beam, which needs a drafter: this model has none)" in help_text


def test_command_line():
    p = configure_parser()
    a = p.parse_args([])
    assert (a.model, a.drafter, a.beam_width, a.beam_length, a.no_speculative) == (None, None, None, None, False)
    a = p.parse_args(["--model", "x.gguf", "--drafter", "d", "--beam-width", "8", "--beam-length", "5",
                      "--temperature", "0.7", "--top-p", "0.9", "--max-tokens", "32", "--system", "Be brief.",
                      "--no-speculative"])
    assert (a.beam_width, a.beam_length, a.temperature, a.top_p, a.max_tokens) == (8, 5, 0.7, 0.9, 32)
    assert a.lookup is None and p.parse_args(["--lookup", "0"]).lookup == 0
    assert a.tree_min_prob is None and p.parse_args(["--tree-min-prob", "0.05"]).tree_min_prob == 0.05
    with pytest.raises(SystemExit):
        p.parse_args(["--tree-min-prob", "0"])
    assert "examples:" in p.format_help()
    # --lookup, --tree and --tree-min-prob said "default: the library's default", which names no value
    from redrafter_mlx.tree_search import DEFAULT_MIN_PROB
    from redrafter_mlx.tuning import DEFAULT_LOOKUP, DEFAULT_TREE

    said = " ".join(p.format_help().split())
    assert "the library's default" not in said
    for stated in (f"0 = off; default: tuned, else {DEFAULT_LOOKUP})", f"(0 = beams; default: tuned, else {DEFAULT_TREE})",
                   f"default: tuned, else {DEFAULT_MIN_PROB:g})"):
        assert stated in said, stated
    with pytest.raises(SystemExit):
        p.parse_args(["--beam-width", "0"])
    with pytest.raises(SystemExit):
        p.parse_args(["--lookup", "-2"])


async def test_commands_are_forgiving_and_double_slash_sends_a_slash():
    engine = FakeEngine(["Sure."])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for line in ("/", "/ ", "/nosuch", "/help me"):
            await ask(pilot, line)  # a notice, never a crash
            # (app.messages, not engine.calls: the engine records a call from its own thread, later, so a line sent
            # as a message could pass a check of engine.calls made here)
            assert app.is_running and not app.generating and app.messages == [], line
        await ask(pilot, "/SPEC OFF")
        assert not app.settings.speculative
        await ask(pilot, "//usr/bin/env: what does it do?")
        await finished(pilot)
        # the one message sent (engine.calls[-1] alone passed with the lines above sent as messages before it)
        assert [call[0] for call in engine.calls] == [[{"role": "user", "content": "/usr/bin/env: what does it do?"}]]


async def test_a_typed_command_with_brackets_is_quoted_as_typed():
    """An unknown or malformed /command is quoted in a notice, which Textual read as markup: "/x [/b]" crashed
    the chat with a MarkupError, and "/beam [red]2 3" was quoted without its "[red]"."""
    from textual.widgets._toast import Toast

    app = create_app(FakeEngine(["x"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        for line in ("/x [/b]", "/beam [red]2 3", "/x [link=file:///etc]"):
            await ask(pilot, line)
            await pilot.pause()
        await pilot.pause(0.2)
        shown = " ".join(str(toast.render()) for toast in app.screen.query(Toast))
        assert app.is_running and all(line in shown for line in ("/x [/b]", "/beam [red]2 3", "[link=file:///etc]"))


async def test_an_empty_message_is_refused_with_a_word():
    engine = FakeEngine(["x"])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for typed in ("   ", "\u200b", " \u2060\ufeff "):  # invisible characters alone are empty too
            await ask(pilot, typed)
            await pilot.pause()
            assert not engine.calls and app.query_one(PromptInput).value == ""
        assert sum("empty" in str(n.message) for n in app._notifications) == 3


def test_the_chats_rule_for_an_empty_message_is_the_librarys():
    """The app does not import the library (it imports MLX): its mirror of the rule must agree."""
    from app.app import blank
    from redrafter_mlx.tokenizer import is_blank

    for text in ("", " \n\t", "\u200b", "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e", "\x00\x7f", "\u3000",
                 "a", "\u200ba", "日本", "🙂", "\u2800", "é"):
        assert blank(text) == is_blank(text), repr(text)


async def test_a_second_message_while_loading_stays_in_the_box():
    gate = threading.Event()
    engine = FakeEngine(["Ready now."], load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "first question")
        await ask(pilot, "second question")
        assert app.query_one(PromptInput).value == "second question"  # not silently dropped
        gate.set()
        await ready(pilot)
        await wait_for(pilot, lambda: engine.calls)
        await finished(pilot)
        assert [m[0][-1]["content"] for m in engine.calls] == ["first question"]


async def test_a_reply_that_fails_before_a_word_takes_its_turn_back():
    engine = FakeEngine(["x"], fail_reply=EngineError("the prompt has 9 tokens but fake-135m has a context of 4: "
                                                       "shorten it"))
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "a long question")
        await finished(pilot)
        assert app.status == "error" and app.messages == []
        assert not app.query(UserMessage) and not app.query(AssistantMessage)  # no bubble the model never saw
        assert app.query_one(PromptInput).value == "a long question"
        await pilot.pause()
        assert any("shorten it" in str(n.render()) for n in app.query(Notice))
        # (the bubble vanished and the text came back into the box without a word about it)
        assert str(app.query(Notice).last().render()).endswith("\nThe message was taken back into the prompt box.")



async def test_a_reply_errors_whole_text_is_reachable_by_details():
    """A reply's error showed its first line only, the rest lost for good (the engine kept one line): the notice
    still keeps to that line, says /details shows the rest, and /details shows the whole text. A one-line error
    says nothing more, and /details then says there is nothing to show."""
    from app.engine import failure

    error = RuntimeError("[metal::malloc] Attempting to allocate 9 GB\nwhich is more than the limit of 8 GB.")
    assert (str(failure(error)), failure(error).details) == \
        ("RuntimeError: [metal::malloc] Attempting to allocate 9 GB", f"RuntimeError: {error}")
    assert failure(ValueError("one line"), named=False).details == ""
    for raised, notice, whole in ((error, "The reply failed: RuntimeError: [metal::malloc] Attempting to allocate 9 GB",
                                   "which is more than the limit of 8 GB."),
                                  (failure(error), "The reply failed: RuntimeError: [metal::malloc] Attempting",
                                   "which is more than the limit of 8 GB."),
                                  (EngineError("one line only"), "The reply failed: one line only", None)):
        app = create_app(FakeEngine(["x"], fail_reply=raised))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await ask(pilot, "a question")
            await finished(pilot)
            said = str(app.query(Notice).last().render())
            assert said.startswith(notice) and "limit of 8 GB" not in said
            assert ("(/details shows the whole error)" in said) == (whole is not None)
            await ask(pilot, "/details")
            await pilot.pause()
            if whole is None:
                assert "No error to show in full" in str(list(app._notifications)[-1].message)
            else:
                assert str(app.query(Notice).last().render()).endswith(f"in full:\nRuntimeError: {error}")


async def test_a_reply_that_fills_the_context_says_how_to_go_on():
    """A reply stopped by the context length leaves a conversation that no next message fits: the bubble said
    "stopped: context full", and the next message failed before saying to start a new chat."""
    from app.engine import Chunk

    engine = FakeEngine(["x"])

    def fills(messages, settings, should_stop, on_status=None):
        engine.calls.append((messages, settings))
        yield Chunk("A long answer", Stats(new_tokens=3, steps=2), "context")

    engine._reply = fills
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Tell me everything.")
        await finished(pilot)
        assert app.status == "done (context)"
        assert app.query_one(AssistantMessage).border_subtitle == "stopped: context full · Ctrl+N new chat"

async def test_a_reply_cut_at_max_tokens_says_the_limit_and_its_option():
    """A reply cut by the token limit said "stopped: max tokens": not which limit (256 unless given), nor that
    --max-tokens sets it."""
    app = create_app(FakeEngine(["one two three four five"]), Settings(max_tokens=3))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Count.")
        await finished(pilot)
        assert app.status == "done (length)" and transcript_replies(app) == ["one two three "]
        assert app.query_one(AssistantMessage).border_subtitle == "stopped at 3 tokens (--max-tokens)"


def screen_text(app: ChatApp) -> str:
    """The screen as drawn, one line of text per row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(segment.text for segment in strip).rstrip() for strip in strips)


@pytest.mark.parametrize("reason,note", [("length", "stopped at 16384 tokens (--max-tokens)"),
                                         ("context", "stopped: context full · Ctrl+N new chat")])
async def test_a_reply_s_note_fits_its_bubble_beside_the_stats_panel(reason, note):
    """The note in a reply's bottom border is cut ("…") past the bubble's width: at 100 columns (the narrowest that
    shows the stats panel) it read "stopped: max tokens (256; --max-tokens s…" and "stopped: context full · Ctrl+N
    starts a new c…", what to do cut off. The notes are whole there."""
    from app.engine import Chunk

    engine = FakeEngine(["x"])

    def stops(messages, settings, should_stop, on_status=None):
        yield Chunk("An answer", Stats(new_tokens=3, steps=2), reason)

    engine._reply = stops
    app = create_app(engine, Settings(max_tokens=16384))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.query_one(StatsPanel).display
        await ask(pilot, "Go on.")
        await finished(pilot)
        await pilot.pause()
        assert app.query_one(AssistantMessage).border_subtitle == note
        assert f" {note} ─╯" in screen_text(app)


async def test_the_panel_says_how_much_of_the_context_the_conversation_holds():
    """The panel gave the context's size alone ("context 8192 tokens"), and a conversation ran into "context
    full" with nothing on screen saying how close it was: it says the tokens used, as of the last reply."""
    app = create_app(FakeEngine([REPLY]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "context      2,048 tokens" in panel(app).splitlines()
        await ask(pilot, "Explain.")
        await finished(pilot)
        assert "context      20 of 2,048 tokens used" in panel(app).splitlines()  # 5 prompt + 15 reply tokens
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "context      2,048 tokens" in panel(app).splitlines()


async def test_a_long_prompt_shows_its_reading_and_a_cancel_then_withdraws_it():
    engine = FakeEngine(["x"], hold_after=0, prefill_status=("reading the prompt: 512 of 2048 tokens",))
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "a pasted document")
        await wait_for(pilot, lambda: app.reply_view is not None
                       and app.reply_view.border_subtitle == "reading the prompt: 512 of 2048 tokens")
        await pilot.press("escape")
        await finished(pilot)
        assert app.status == "ready" and app.messages == []  # (as before it: the reply is withdrawn)
        assert not app.query(UserMessage) and not app.query(AssistantMessage)
        assert app.query_one(PromptInput).value == "a pasted document"
        await pilot.pause()  # it said nothing: the message vanished from the transcript unexplained
        assert any("taken back into the prompt box" in str(n.render()) for n in app.query(Notice))


@pytest.mark.parametrize("before_a_word", [True, False])
async def test_a_reply_being_cancelled_says_so_on_itself(before_a_word):
    """Esc set the panel's status to "cancelling…" and nothing else: under 100 columns the panel is hidden, and a reply
    stops only after its step, or the chunk of a long prompt it reads (seconds), the screen unchanged meanwhile. The
    reply's bubble says "cancelling…" until it has stopped (a prompt-reading line coming then does not replace it)."""
    engine = FakeEngine(["Several words to stream here."], hold_after=0 if before_a_word else 2,
                        prefill_status=("reading the prompt: 512 of 2048 tokens",))
    seen, held = threading.Event(), engine._reply

    def gated(messages, settings, should_stop, on_status=None):  # the stop is seen only when the test says
        yield from held(messages, settings, lambda: seen.is_set() and should_stop(), on_status)

    engine._reply = gated
    app = create_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        assert not app.query_one(StatsPanel).display
        await ask(pilot, "a pasted document")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.border_subtitle
                       == ("reading the prompt: 512 of 2048 tokens" if before_a_word else ""))
        if not before_a_word:
            await wait_for(pilot, lambda: app.reply_view.text)
        await pilot.press("escape")
        await pilot.pause()
        view = app.reply_view
        try:
            assert app.status == "cancelling" and view.border_subtitle == "cancelling…"
            app.post_message(ReplyStatus(app.reply_id, "reading the prompt: 1024 of 2048 tokens"))
            await pilot.pause()
            assert view.border_subtitle == "cancelling…"
        finally:
            seen.set()  # (the reply ends, and the app with it, whatever was asserted)
        await finished(pilot)
        if not before_a_word:
            assert view.border_subtitle == "cancelled"


async def test_a_reply_cancelled_before_a_word_leaves_the_stats_panel_as_it_was():
    """A reply cancelled before its first word is withdrawn, but its prefill-only figures (prefill, peak
    memory, "generated 0 tokens") stayed in the panel, of a reply that is gone: the panel shows what it
    showed before that reply, the previous reply's figures and status."""
    engine = FakeEngine(["First answer.", "x"])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "one")
        await finished(pilot)
        before = panel(app)
        assert "status       done (eos)" in before and "generated" in before
        engine.hold_after = 0
        await ask(pilot, "a pasted document")
        await wait_for(pilot, lambda: "status       generating…" in panel(app))
        await pilot.press("escape")
        await finished(pilot)
        assert app.messages[-1]["role"] == "assistant" and not app.query(UserMessage)[1:]
        assert panel(app) == before


async def test_a_reply_that_fails_before_a_word_leaves_the_previous_figures_in_the_panel():
    """A reply cancelled before its first word gives the panel back the figures of the reply before it; one
    that failed before its first word left them blank ("tok/s —", no "generated")."""
    engine = FakeEngine(["First answer."])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "one")
        await finished(pilot)
        before = panel(app)
        assert "generated    2 tokens" in before
        engine.fail_reply = EngineError("the prompt has 9 tokens but fake-135m has a context of 4: shorten it")
        await ask(pilot, "a long question")
        await finished(pilot)
        assert app.status == "error" and app.query_one(PromptInput).value == "a long question"
        assert panel(app) == before.replace("done (eos)", "error")


async def test_a_pasted_text_keeps_its_line_breaks():
    engine = FakeEngine(["ok"])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.query_one(PromptInput)
        shown = await paste(pilot, "Fix this code:\ndef add(a, b):\n    return a - b\n")
        assert shown == "Fix this code:⏎def add(a, b):⏎    return a - b"
        await pilot.press("enter")
        await finished(pilot)
        assert engine.calls[-1][0][-1]["content"] == "Fix this code:\ndef add(a, b):\n    return a - b"
        assert await paste(pilot, "one line") == "one line"  # Input's own paste
        box.value = ""
        await paste(pilot, " \n \n ")  # blank lines show as "⏎": still an empty message
        calls = len(engine.calls)
        await pilot.press("enter")
        await pilot.pause()
        assert len(engine.calls) == calls and len(app.query(UserMessage)) == 1


async def test_a_message_keeps_its_first_lines_indentation():
    """Sending stripped all surrounding whitespace: pasted code lost its first line's indentation. Leading
    blank lines and trailing whitespace go; the rest is sent as pasted, and ↑ brings it back so."""
    engine = FakeEngine(["ok", "ok", "ok"])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.query_one(PromptInput)
        assert await paste(pilot, "\n    x = f(1)\n    return x  \n\n") == "    x = f(1)⏎    return x  "
        await pilot.press("enter")
        await finished(pilot)
        assert engine.calls[-1][0][-1]["content"] == "    x = f(1)\n    return x"
        await pilot.press("up")
        assert box.value == "    x = f(1)⏎    return x"
        await ask(pilot, "  ⏎  \tindented  ")  # a blank first line goes, the next one's indentation stays
        await finished(pilot)
        assert engine.calls[-1][0][-1]["content"] == "  \tindented"
        await ask(pilot, "  //etc/hosts")  # // still sends a message that starts with /
        await finished(pilot)
        assert engine.calls[-1][0][-1]["content"] == "  /etc/hosts"
        await ask(pilot, "  ⏎ \t ")
        await pilot.pause()
        assert len(engine.calls) == 3 and "empty" in str(list(app._notifications)[-1].message)


async def test_a_message_given_back_unsent_keeps_its_double_slash():
    """//x sends "/x"; handed back unsent (cancelled while it waited for the model, or before the reply's
    first word) the box showed "/x", which Enter then ran as a command: it shows "//x" again."""
    gate = threading.Event()
    engine = FakeEngine(["x"], hold_after=0, load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await ask(pilot, "//etc/hosts is empty")
        await pilot.pause()
        await pilot.press("escape")  # the message waiting for the model
        box = app.query_one(PromptInput)
        assert box.value == "//etc/hosts is empty"
        gate.set()
        await ready(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.generating)
        assert engine.calls[-1][0][-1]["content"] == "/etc/hosts is empty"
        await pilot.press("escape")  # before its first word: withdrawn
        await finished(pilot)
        assert box.value == "//etc/hosts is empty"


async def test_a_fixed_beam_without_a_drafter_says_it_stays_adaptive():
    app = create_app(FakeEngine(["x"], drafter=None), Settings(adaptive=False, beam_width=8, beam_tuned=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.settings.adaptive
        assert any("needs a drafter" in str(n.render()) for n in app.query(Notice))
        await pilot.press("f6")
        assert app.settings.adaptive and app.settings.beam_width == 8


async def test_the_stats_panel_hides_on_narrow_terminals_and_toggles():
    app = create_app(FakeEngine(["x"]))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        stats = app.query_one(StatsPanel)
        assert not stats.display
        # (only /help said so: the stats, the chat's point, were out of sight with nothing on screen saying why)
        said = " ".join(str(n.render()) for n in app.query(Notice))
        assert "The live stats panel is hidden under 100 columns: F2 shows it." in said
        await pilot.press("f2")
        assert stats.display
        await ask(pilot, "/stats")
        assert not stats.display
    app = create_app(FakeEngine(["x"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.query_one(StatsPanel).display
        assert "F2 shows it" not in " ".join(str(n.render()) for n in app.query(Notice))


async def test_the_stats_panel_shown_on_a_very_narrow_terminal_fits_it():
    """F2 on a terminal narrower than the panel's 48 columns drew it past the right edge, its figures
    cut ("44% (8 drafts accepte"); it takes the width there is now, and its lines wrap."""
    app = create_app(FakeEngine([REPLY]))
    async with app.run_test(size=(40, 20)) as pilot:
        await ready(pilot)
        await ask(pilot, "hi")
        await finished(pilot)
        await pilot.press("f2")
        await pilot.pause()
        stats = app.query_one(StatsPanel)
        assert stats.display and stats.region.right <= 40


def test_command_line_refusals_and_the_drafting_rule(monkeypatch, capsys):
    """--graph with fixed drafting needs a tree (else every reply would fail); the chat's own
    adaptive-or-fixed rule is the library's; a load error outlives the screen, with status 1."""
    import itertools

    import app.app as app_module
    from app.__main__ import GRAPH_NEEDS_TREE, main, settings_from
    from redrafter_mlx import tuning

    for argv in (["--graph", "1", "-W", "2"], ["--graph", "0", "--tree", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--graph drafts a dynamic tree, and these options draft W x L beams" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # over a tree only a load would name: the chat's own refusal
        main(["--graph", "1", "--lookup", "4"])
    assert GRAPH_NEEDS_TREE in capsys.readouterr().err
    with pytest.raises(SystemExit):  # ignored, saying nothing: greedy decoding has no nucleus
        main(["--top-p", "0.9"])
    assert "--top-p applies to sampling, and --temperature 0 decodes greedily" in capsys.readouterr().err
    p = configure_parser()
    flags = (("--beam-width", "2"), ("--beam-length", "3"), ("--lookup", "0"), ("--tree", "8"),
             ("--tree-min-prob", "0.1"))
    for given in itertools.product((False, True), repeat=len(flags)):  # the chat drafts adaptively as the library
        a = p.parse_args([x for on, f in zip(given, flags) if on for x in f])
        assert settings_from(a).adaptive == (not tuning.fixed_drafting(a.beam_width, a.beam_length, a.lookup, a.tree,
                                                                       a.tree_min_prob))

    class Failed:
        load_error = "no model 'org/nope' on the Hugging Face hub"
        load_details = None
        status, return_code = "load failed", 0

        def run(self):
            pass

    monkeypatch.setattr(app_module, "create_app", lambda engine, settings: Failed())
    monkeypatch.setattr("app.__main__.has_terminal", lambda: True)
    assert main(["--model", "org/nope"]) == 1
    assert capsys.readouterr().err == "redrafter-chat: error: no model 'org/nope' on the Hugging Face hub\n"
    Failed.load_error, Failed.load_details = "RuntimeError: [metal] out of memory", "RuntimeError: [metal] out of " \
        "memory\n  allocating 2 GB"
    assert main(["--model", "org/nope"]) == 1  # the whole error, which the screen cut to its first line
    assert capsys.readouterr().err == "redrafter-chat: error: RuntimeError: [metal] out of memory\n  allocating 2 GB\n"


def test_the_chat_without_a_terminal_says_so_and_exits():
    """`redrafter-chat < /dev/null` (or `| cat`) drew escape codes into the pipe and waited forever,
    spinning a core: it needs a terminal, and says so in one line before loading anything."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "app", "--model", "org/nope"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1].startswith("redrafter-chat: error: the chat needs a terminal")
    assert "python -m redrafter_mlx PROMPT" in out.stderr



def test_the_chat_with_standard_error_redirected_says_so_and_exits():
    """Textual draws the screen on standard error: `redrafter-chat 2>chat.log` in a terminal drew it all into
    the log, left the terminal blank and waited for keys. It is refused as other redirections are."""
    import os
    import pty
    import subprocess

    leader, follower = pty.openpty()  # a terminal for input and output
    try:
        out = subprocess.run([sys.executable, "-m", "app", "--model", "org/nope"], stdin=follower, stdout=follower,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith("redrafter-chat: error: the chat needs a terminal")

# ---- snapshots (regenerate with: pytest tests/test_app.py --snapshot-update) -----------------


def _no_blink(app):
    async def run_before(pilot):
        app.query_one(PromptInput).cursor_blink = False
        await ready(pilot)

    return run_before


def test_snapshot_idle(snap_compare):
    app = create_app(FakeEngine([REPLY]))
    assert snap_compare(app, terminal_size=SIZE, run_before=_no_blink(app))


def test_snapshot_finished(snap_compare):
    app = create_app(FakeEngine([REPLY + "\n\n- draft\n- verify\n- accept"]))

    async def run_before(pilot):
        await _no_blink(app)(pilot)
        await ask(pilot, "What is speculative decoding?")
        await finished(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


# ---- the real default model ------------------------------------------------------------------


async def test_real_default_model_short_reply():
    """Loads smollm2-135m on MLX through the engine thread and streams a short reply."""
    app = create_app(Engine("smollm2-135m"), Settings(max_tokens=8, lookup=4))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.ready or app.status == "load failed", timeout=300)
        assert app.ready, str(app.query_one(LoadStatus).render())
        await ask(pilot, "Say hello.")
        await wait_for(pilot, lambda: app.status not in ("generating", "cancelling"), timeout=300)
        await pilot.pause()
        assert app.status.startswith("done"), app.status
        assert transcript_replies(app)[0].strip()
        text = panel(app)
        assert "model        smollm2-135m" in text and "tok/s" in text and "peak memory" in text


def test_the_engine_thread_frees_its_mlx_streams_when_closed(monkeypatch):
    """MLX's streams must be destroyed by the thread that made them: left to the interpreter's exit
    they aborted the process now and then ("terminate called without an active exception"), e.g.
    on quitting the chat. Engine threads call mx.clear_streams as they end; a closing engine stops
    a load at its next stage."""
    import subprocess
    import sys
    import threading

    import mlx.core as mx

    seen = []
    monkeypatch.setattr(mx, "clear_streams", lambda: seen.append(threading.current_thread().name))
    engine = Engine("unused")
    engine.close()
    assert engine.closing.is_set() and engine.wait(5) and seen == ["mlx-engine"]
    with pytest.raises(EngineError, match="closed"):
        engine._stop_if_closing()

    code = ("import mlx.core as mx\n"
            "from app.engine import Engine\n"
            "e = Engine('unused')\n"
            "a = e.call(lambda: mx.eval(mx.random.normal((256, 256)) @ mx.random.normal((256, 256))))\n"
            "e.close(); assert e.wait(10)\n")
    for _ in range(6):  # without clear_streams, about 1 run in 6 aborted at exit here
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=str(__import__("pathlib").Path(__file__).parent.parent))
        assert proc.returncode == 0, proc.stderr


def test_drafts_too_big_are_refused_while_parsing(monkeypatch, capsys):
    """-W 100 -L 16, --tree 5000 and --lookup 5000 opened the chat, then every reply failed with
    the library's limit: now they are refused at once, by the library's own rule."""
    from app.__main__ import main
    from redrafter_mlx.generate import MAX_DRAFT_TOKENS

    monkeypatch.setattr("app.__main__.has_terminal", lambda: False)  # main() ends there when nothing is refused
    for argv, words in ((["-W", "100", "-L", "16"], ["beams of 100 x 16 tokens draft 1500"]), (["--tree", "5000"], ["--tree 5000"]),
                        (["--lookup", "5000"], ["--lookup 5000"]), (["-W", "2000"], ["--beam-width 2000"]),
                        (["--graph", "1025"], ["--graph 1025: GSD's k-gram length is at most 1024 ("]),
                        (["--no-drafter", "-W", "4"], ["--beam-width shapes the drafter's drafts, and --no-drafter"]),
                        (["--model", " "], ["--model is empty"]),
                        (["--drafter", "d", "--no-drafter"], ["opposite things"]),  # and options it ignored
                        (["--no-context-graph"], ["applies to graph drafting"])):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert all(w in err for w in words), err
    for argv in (["-W", "64", "-L", "17"], ["--tree", str(MAX_DRAFT_TOKENS), "--lookup", str(MAX_DRAFT_TOKENS)],
                 ["-L", str(MAX_DRAFT_TOKENS + 1)], ["--graph", str(MAX_DRAFT_TOKENS)]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "the chat needs a terminal" in capsys.readouterr().err, argv


def test_a_missing_model_path_or_drafter_is_refused_before_the_chat_opens(monkeypatch, capsys, tmp_path):
    """The screen opened, and the error waited for Ctrl+Q (with no terminal, forever); an unknown registry name
    (--model nope) was said only after the screen opened, where a missing path was refused before."""
    import app.app as app_module
    from app.__main__ import main

    monkeypatch.setattr(app_module, "create_app", lambda *a: pytest.fail("the chat opened"))
    for argv, said in ((["--model", str(tmp_path / "none.gguf")], "none.gguf: no such file or folder"),
                       (["--model", "./models/mine"], "--model ./models/mine: no such file or folder"),
                       (["--model", "nope"], "--model nope: not a known name (gemma3-1b-4bit, "),
                       (["--model", "models/mine/v2"], "--model models/mine/v2: no such file or folder"),
                       (["--model", "mine.safetensors"], "--model mine.safetensors: no such file or folder"),
                       (["--drafter", str(tmp_path)], "no drafter there")):
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err


async def test_the_opening_notice_says_plain_decoding_when_speculation_starts_off():
    """With --no-speculative it read "is off, adaptive"."""
    app = create_app(FakeEngine(["x"]), Settings(speculative=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        said = " ".join(str(n.render()) for n in app.query(Notice))
        assert "is off (plain decoding; adaptive when on)" in said and "off, adaptive" not in said


def test_the_panel_counts_one_token_and_one_step_in_the_singular():
    """The panel said "1 tokens read", "1 tokens · 0 steps" and "(1 drafts accepted)"."""
    from app.engine import Stats
    from app.stats_view import Baseline, reply_rows

    one = Stats(mode="redrafter", prompt_tokens=1, new_tokens=1, steps=1, acceptance=0.5, accepted_tokens=1,
                beam_width=2, beam_length=3)
    rows = dict(reply_rows(one, Baseline(), "done"))
    assert rows["prefill"] == "0.00 s · 1 token" and rows["generated"] == "1 token · 1 step"
    assert rows["acceptance"] == "50% (1 draft accepted)"
    rows = dict(reply_rows(replace(one, prompt_tokens=7, cached_tokens=6, new_tokens=2, steps=0), Baseline(), "done"))
    assert rows["prefill"] == "0.00 s · 1 token read + 6 cached" and rows["generated"] == "2 tokens · 0 steps"


def test_an_adaptive_reply_is_measured_against_the_controllers_plain_steps():
    """The warm-up's 8 tokens on "Hello" read 14.9 tok/s in one session and 5.0 in another, so a reply
    decoded plainly throughout showed 1.80x or 0.56x, and "0% (0 drafts accepted)" of no drafts."""
    from app.engine import Stats
    from app.stats_view import Baseline, reply_rows

    parked = Stats(mode="auto", new_tokens=41, steps=40, tokens_per_second=19.6, tokens_per_step=1.0,
                   parked_share=1.0, decode_seconds=2.04, controller={"plain_ms": 50.0, "x16": 2.0, "x64": 5.0})
    rows = dict(reply_rows(parked, Baseline(calibration=5.0), "done"))
    assert rows["speedup"] == "0.98×" and rows["  vs plain"] == "20.0 tok/s (timed plain steps)"
    assert rows["acceptance"] == "— (nothing drafted: every step plain)"
    baseline = Baseline(calibration=5.0, plain_tokens=100, plain_seconds=4.0, plain_replies=1)
    rows = dict(reply_rows(parked, baseline, "done"))  # this session's plain replies come first
    assert rows["  vs plain"] == "25.0 tok/s (1 plain reply)" and rows["speedup"] == "0.78×"
    drafting = Stats(mode="auto", new_tokens=41, steps=20, tokens_per_second=40.0, parked_share=0.2,
                     acceptance=0.5, accepted_tokens=20, controller={"plain_ms": 50.0})
    rows = dict(reply_rows(drafting, Baseline(), "done"))
    assert rows["speedup"] == "2.00×" and rows["acceptance"] == "50% (20 drafts accepted)"


async def test_new_chat_while_loading_keeps_the_load_status_and_takes_a_queued_message_back():
    """Ctrl+N while the model loaded removed the load status (so a failure later showed no reason), and
    a message typed meanwhile was still sent after "New chat."."""
    gate = threading.Event()
    engine = FakeEngine(["Ready now."], load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        # nothing to clear or copy before the model: out of the footer (they said "Nothing to clear yet")
        assert not footer_keys(app) & {"ctrl+n", "ctrl+y"} and {"ctrl+t", "f5", "ctrl+q"} <= footer_keys(app)
        await pilot.press("ctrl+n")
        assert str(list(app._notifications)[-1].message) == "Nothing to clear yet: the model is still loading."
        await ask(pilot, "An early question⏎with a second line")
        assert "ctrl+n" in footer_keys(app)  # (it takes the waiting message back)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.query_one(PromptInput).value == "An early question⏎with a second line" and app._queued is None
        assert len(app.query(LoadStatus)) == 1
        gate.set()
        await ready(pilot)
        await pilot.pause()
        assert engine.calls == [] and "Ready in" in str(app.query_one(LoadStatus).render())
        assert {"ctrl+n", "ctrl+y"} <= footer_keys(app)
    gate = threading.Event()
    app = create_app(FakeEngine(fail_load="no such model", load_gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        gate.set()
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "The model did not load: no such model" in str(app.query_one(LoadStatus).render())


async def test_beam_keys_keep_a_command_line_shape_past_their_range():
    """F8 on -W 32 -L 4 gave 16 x 5: the keys' 1-16 range cut the width nobody touched."""
    app = create_app(FakeEngine([REPLY]), Settings(beam_width=32, beam_length=4, adaptive=False))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f8")
        assert (app.settings.beam_width, app.settings.beam_length) == (32, 5)
        await pilot.press("f6")  # past the command line's width: held there
        assert app.settings.beam_width == 32
        await pilot.press("f5")
        assert app.settings.beam_width == 31



@pytest.mark.parametrize("lookup, said", [(None, "the conversation's copy alone"), (0, "drafts nothing: plain decoding")])
async def test_a_beam_length_of_1_says_what_it_drafts(lookup, said):
    """F7 down to a length of 1 said "drafts nothing: plain decoding", while the engine (mode redrafter) went on
    drafting the conversation's copy (stream's docstring: L=1 "still adds the lookup beam"; a tiny model's steps
    verified 2.4 tokens and took 9), as the stats panel said; the notice says so, and plain only with --lookup 0."""
    app = create_app(FakeEngine([REPLY]), Settings(beam_width=2, beam_length=2, adaptive=False, lookup=lookup))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f7")
        assert app.settings.beam_length == 1
        assert str(list(app._notifications)[-1].message).endswith(said + ".")


async def test_no_drafter_with_a_lookup_drafts_the_copy_alone():
    """`redrafter-chat --no-drafter --lookup 8` ran adaptive and ignored 8, where the main CLI drafts the
    context's copy alone, fixed: the chat keeps the fixed lookup now, and says so."""
    engine = FakeEngine(["x y"], drafter=None)
    app = create_app(engine, Settings(adaptive=False, lookup=8))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert not app.settings.adaptive
        assert any("--lookup 8 drafts the conversation's copy alone" in str(n.render()) for n in app.query(Notice))
        assert "beam         none: the copy alone, 8 tokens (up to 32)" in panel(app)
        await ask(pilot, "Hi")
        await finished(pilot)
        assert not engine.calls[-1][1].adaptive and engine.calls[-1][1].lookup == 8
        await pilot.press("f6")  # a beam still needs the drafter: the copy stays
        assert not app.settings.adaptive and any("copy alone" in str(n.message) for n in app._notifications)



async def test_the_lookup_copy_is_said_to_grow_as_it_does():
    """A fixed lookup copy taken whole is twice as long the next step, up to 4 x N (lookup.CopyLength): with
    --lookup 4 and no drafter, steps of 16 tokens. The chat said "up to 4 tokens a step" (its note), "the copy
    alone, up to 4 tokens" (the panel) and "draft up to N tokens" (--help)."""
    from redrafter_mlx.lookup import MAX_GROWTH

    from app.engine import COPY_GROWTH

    assert COPY_GROWTH == MAX_GROWTH
    app = create_app(FakeEngine(["x"], drafter=None), Settings(adaptive=False, lookup=4))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        note = next(str(n.render()) for n in app.query(Notice) if "--lookup 4" in str(n.render()))
        assert "4 tokens a step, twice as many after a copy taken whole, up to 16." in note
        assert "beam         none: the copy alone, 4 tokens (up to 16)" in panel(app)
    lookup = next(a for a in configure_parser()._actions if "--lookup" in a.option_strings)
    assert "up to 4N" in lookup.help and "up to N" not in lookup.help

def test_the_engine_drafts_the_copy_alone_without_a_drafter(tiny_loaded):
    """What the engine asks of the library: with no drafter and a lookup given, fixed drafting of the
    copy alone (redrafter, no drafter beams: 1 x 1); --lookup 0 or speculation off, plain decoding;
    greedy text as plain decoding's either way."""
    from redrafter_mlx import PromptCache

    engine = Engine("unused", warm_up=False)
    try:
        engine._m, engine._cache = tiny_loaded, PromptCache(tiny_loaded.model)
        said = [{"role": "user", "content": "a b c a b c a b c a b c"}]

        def last(**settings):
            engine.new_chat()
            chunks = list(engine.reply(said, Settings(max_tokens=12, **settings), lambda: False))
            return chunks[-1].stats, "".join(c.text for c in chunks)

        copy, copy_text = last(adaptive=False, lookup=4)
        assert (copy.mode, copy.beam_width, copy.beam_length) == ("redrafter", 1, 1)
        for plain in (dict(adaptive=False, lookup=0), dict(adaptive=False, lookup=4, speculative=False)):
            stats, text = last(**plain)
            assert stats.mode == "ar" and text == copy_text
    finally:
        engine.close()
        engine.wait(10)



async def test_a_reply_cancelled_mid_way_leaves_the_conversation_and_the_kv_cache_whole(tiny_kit, tmp_path):
    """Esc mid-reply on the real engine (adaptive, then a fixed beam): the streamed part stays as the assistant
    turn, and the next reply, drawn on the conversation's KV cache, is token for token what plain decoding
    gives for the conversation as shown."""
    from redrafter_mlx import generate
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "m", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    for settings in (Settings(max_tokens=24), Settings(max_tokens=24, adaptive=False, beam_width=3, beam_length=4)):
        engine = Engine(str(path), warm_up=False)
        stream = engine._stream

        def held(messages, settings, should_stop, on_status, stream=stream):  # the first reply waits for Esc
            for n, chunk in enumerate(stream(messages, settings, should_stop, on_status)):
                while n == 4 and len(messages) == 1 and not should_stop():
                    time.sleep(0.01)
                yield chunk

        engine._stream = held
        app = create_app(engine, settings)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await ask(pilot, "the a the 12 héllo")
            await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text)
            await pilot.press("escape")
            await finished(pilot)
            assert app.status == "cancelled" and app.messages[-1]["content"]
            assert app.messages[-1]["content"] == transcript_replies(app)[-1]
            await ask(pilot, "日本 the é")
            await finished(pilot)
            shown = app.messages[:-1]
            plain = engine.call(lambda: generate(engine._m, shown, mode="ar", max_tokens=24).text)
            assert app.messages[-1] == {"role": "assistant", "content": plain}
            assert app.stats.cached_tokens > 0  # drawn on the cache the cancelled reply left

async def test_the_prefill_row_says_how_many_tokens_it_read():
    """On later turns the prefill's seconds cover only the prompt's part the KV cache did not hold, while the
    row gave the whole prompt's tokens ("0.05 s · 1500 tokens", an impossibly fast prefill): it says the
    tokens read and the ones cached."""
    app = create_app(FakeEngine(["First.", "Second."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "one two")
        await finished(pilot)
        assert "prefill      0.06 s · 6 tokens\n" in panel(app)  # nothing cached yet
        await ask(pilot, "three")
        await finished(pilot)
        assert "prefill      0.10 s · 10 tokens read + 6 cached\n" in panel(app)
        assert app.stats.prompt_tokens == 16 and app.stats.cached_tokens == 6


def test_the_engine_reports_the_prompt_tokens_the_cache_held(tiny_loaded):
    """The real engine's figure: a second turn's prompt starts with the first turn's tokens, which the
    conversation's PromptCache holds; a new chat holds none."""
    from redrafter_mlx import PromptCache

    engine = Engine("unused", warm_up=False)
    try:
        engine._m, engine._cache = tiny_loaded, PromptCache(tiny_loaded.model)
        turn = [{"role": "user", "content": "a b c d"}]
        first = list(engine.reply(turn, Settings(max_tokens=4, speculative=False), lambda: False))
        assert first[-1].stats.cached_tokens == 0
        turn += [{"role": "assistant", "content": "".join(c.text for c in first)}, {"role": "user", "content": "e"}]
        second = list(engine.reply(turn, Settings(max_tokens=4, speculative=False), lambda: False))[-1].stats
        assert 0 < second.cached_tokens < second.prompt_tokens
        engine.new_chat()
        third = list(engine.reply(turn, Settings(max_tokens=4, speculative=False), lambda: False))[-1].stats
        assert third.cached_tokens == 0 and third.prompt_tokens == second.prompt_tokens
    finally:
        engine.close()
        engine.wait(10)


async def test_a_tree_floor_without_a_tree_is_said():
    """`redrafter-chat --tree-min-prob P` alone counts on a tree tuned for the device; where none is, the
    beams drafted have no floor to apply (the library refuses one there): the chat says so at load, and
    the engine leaves the floor out, so replies still run."""
    engine = FakeEngine([REPLY])
    app = create_app(engine, Settings(adaptive=False, tree_min_prob=0.1))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert any("--tree-min-prob 0.1 is a dynamic tree's floor" in str(n.render()) for n in app.query(Notice))
    app = create_app(FakeEngine([REPLY], beam_shape=(4, 7), tree=12), Settings(adaptive=False, tree_min_prob=0.1))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.settings.tree == 12  # the tuned tree: the floor prunes it, nothing to say
        assert not any("tree's floor" in str(n.render()) for n in app.query(Notice))


def test_the_engine_sends_a_tree_floor_only_with_a_tree(tiny_kit, tmp_path):
    from redrafter_mlx import PromptCache, load
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "tiny", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    m = load(str(path))
    engine = Engine("unused", warm_up=False)
    try:
        engine._m, engine._cache = m, PromptCache(m.model)
        said = [{"role": "user", "content": "a b c d"}]
        for tree in (None, 6):
            engine.new_chat()
            chunks = list(engine.reply(said, Settings(max_tokens=6, adaptive=False, tree=tree, tree_min_prob=0.1),
                                       lambda: False))
            assert chunks[-1].finish_reason and chunks[-1].stats.mode == "redrafter"
            assert chunks[-1].stats.tree == (tree or 0)
    finally:
        engine.close()
        engine.wait(10)


def test_the_chats_drafter_comes_with_its_tuned_shape(tiny_kit, tmp_path):
    """`redrafter-chat --drafter PATH` loads the base model and then the drafter (a bad drafter should
    not cost the model), and so lost what `redrafter-bench --tune` stored for it: the chat drafted 4 x 4
    where `python -m redrafter_mlx --drafter PATH` drafted the tuned shape, tree, lookup and floor."""
    import json

    from redrafter_mlx import load
    from redrafter_mlx._platform import device_description
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "m", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), tmp_path / "d")
    tuned = {"beam_width": 3, "beam_length": 5, "tree": 12, "lookup": 6, "tree_min_prob": 0.3}
    (tmp_path / "d" / "beam_shape.json").write_text(json.dumps({device_description(): tuned}))
    cli = load(str(path), drafter=str(tmp_path / "d"))
    engine = Engine(str(path), str(tmp_path / "d"), warm_up=False)
    try:
        info = engine.load(lambda stage, text: None)
        m = engine._m
        assert (cli.beam_shape, cli.tree, cli.lookup, cli.tree_min_prob) == ((3, 5), 12, 6, 0.3)
        assert (m.beam_shape, m.tree, m.lookup, m.tree_min_prob) == ((3, 5), 12, 6, 0.3)
        assert (info.beam_shape, info.tree, info.drafter) == ((3, 5), 12, str(tmp_path / "d"))
    finally:
        engine.close()
        engine.wait(10)


def test_a_drafter_found_beside_the_model_that_fails_to_load_keeps_the_base(tiny_kit, tmp_path, monkeypatch):
    """A drafter found beside the model (not --drafter) that failed to load made the engine load the base
    model a second time, without a drafter. It now loads the base once and attaches the drafter after it
    (loader.attach_drafter), so a bad drafter costs only itself: the chat comes up without one, saying why."""
    import redrafter_mlx.loader as loader

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    (path / "drafter").mkdir()
    (path / "drafter" / "config.json").write_text("{not json")  # found (it has a config.json), unreadable
    reads = []
    read_folder = loader._load_folder
    monkeypatch.setattr(loader, "_load_folder", lambda *a, **k: reads.append(a[0]) or read_folder(*a, **k))
    engine = Engine(str(path), warm_up=False)
    try:
        info = engine.load(lambda stage, text: None)
        assert reads == [path]  # the base model was read once
        assert info.drafter is None and engine._m.drafter is None
        assert len(info.notices) == 1 and info.notices[0].startswith("The model's drafter did not load (")
        chunks = list(engine.reply([{"role": "user", "content": "a b"}], Settings(max_tokens=4), lambda: False))
        assert chunks[-1].finish_reason
    finally:
        engine.close()
        engine.wait(10)


def test_a_load_error_reaches_the_chat_on_one_line(monkeypatch):
    """Engine._load passed the library's message on whole: one holding line breaks (a path or a wrapped library
    error) broke the chat's one-line notice, "Check --model ..." coming in the middle of it. It is one line."""
    import redrafter_mlx
    from redrafter_mlx.errors import ModelNotFoundError

    def load(*args, **kwargs):
        raise ModelNotFoundError("no model named 'x\ny':\n  not in the registry,   not a file")

    monkeypatch.setattr(redrafter_mlx, "load", load)
    engine = Engine("unused", warm_up=False)
    try:
        with pytest.raises(EngineError) as e:
            engine.load(lambda stage, text: None)
        assert str(e.value) == "no model named 'x y': not in the registry, not a file"
    finally:
        engine.close()
        engine.wait(10)


def test_the_chats_system_prompt_reaches_the_model(tiny_loaded):
    """--system did nothing: the engine sends the conversation as messages with system=, which the
    library ignored for a message list. The reply now follows the prompt with the system message first."""
    from redrafter_mlx import PromptCache, generate

    engine = Engine("unused", warm_up=False)
    try:
        engine._m, engine._cache = tiny_loaded, PromptCache(tiny_loaded.model)
        said = [{"role": "user", "content": "a b c d"}]
        system = "x y z " * 8
        chunks = list(engine.reply(said, Settings(max_tokens=12, speculative=False, system=system), lambda: False))
        want = generate(tiny_loaded, [{"role": "system", "content": system}] + said, mode="ar", max_tokens=12)
        plain = generate(tiny_loaded, said, mode="ar", max_tokens=12)
        assert want.text != plain.text  # the test can tell the two apart
        assert "".join(c.text for c in chunks) == want.text
    finally:
        engine.close()
        engine.wait(10)


def test_the_last_steps_tokens_count_as_the_mean_counts_them(tiny_loaded, monkeypatch):
    """The stats panel showed "N last · M mean": the mean counted the end token a step stopped at, and
    "last" did not (a step of 2 tokens and the end token read "2 last", and a mean of 3)."""
    import redrafter_mlx
    from redrafter_mlx import PromptCache
    from redrafter_mlx.generate import Event
    from redrafter_mlx.stats import RunStats, StepStats

    def stream(*args, **kwargs):  # two speculative steps: 3 tokens, then 2 and the end token
        stats = RunStats(mode="redrafter")
        for step, finish in ((StepStats(emitted=3, accepted=2), None), (StepStats(emitted=2, accepted=2, ended=True), "eos")):
            stats.add(step)
            yield Event("x", [1] * step.emitted, stats, step, finish)

    monkeypatch.setattr(redrafter_mlx, "stream", stream)
    engine = Engine("unused", warm_up=False)
    try:
        engine._m, engine._cache = tiny_loaded, PromptCache(tiny_loaded.model)
        chunks = list(engine.reply([{"role": "user", "content": "a"}], Settings(max_tokens=30), lambda: False))
        final = chunks[-1]
        assert final.finish_reason == "eos" and final.stats.tokens_per_step == 3.0
        assert final.stats.last_step_tokens == 3
    finally:
        engine.close()
        engine.wait(10)


def refused(main, argv, capsys):
    """What a command line's main() refuses of argv, as its one line says it, less the prog and the
    "(options: ...)" hint; None if it goes on (to the chat's terminal check, or the CLI's reply)."""
    try:
        main(argv)
    except SystemExit:
        pass
    err = capsys.readouterr().err.strip()
    if "error: " not in err or "the chat needs a terminal" in err:
        return None
    return err.split("error: ", 1)[1].rsplit(" (options: ", 1)[0]


def test_the_chat_refuses_what_the_cli_refuses_in_its_words(monkeypatch, capsys, tmp_path):
    """The chat checked its options by copies of redrafter_mlx.cli's rules, which drifted: it said "-W shapes
    the drafter's drafts" and its own graph line where `python -m redrafter_mlx` said otherwise. Over every
    combination of the drafting options (with and without --no-drafter), the sampling options, and the
    drafter's, both command lines refuse the same settings in the same words (the chat is mode auto); the
    chat refuses one more: a graph over fixed drafting with no tree given, where every reply would fail."""
    import itertools

    import redrafter_mlx.__main__ as cli_main
    from app.__main__ import GRAPH_NEEDS_TREE, main

    monkeypatch.setattr("app.__main__.has_terminal", lambda: False)  # main() ends there when nothing is refused
    monkeypatch.setattr(cli_main, "_reply", lambda args: 0)  # nor does the CLI load a model
    options = (("--no-drafter",), ("--beam-width", "2"), ("--beam-length", "3"), ("--lookup", "0", "8"),
               ("--tree", "0", "8"), ("--tree-min-prob", "0.1"), ("--graph", "1"))
    choices = [[[]] + [[flag, v] if v else [flag] for v in (values or (None,))] for flag, *values in options]
    argvs = [[x for part in combo for x in part] for combo in itertools.product(*choices)]
    argvs += [["--temperature", t, *(["--top-p", p] if p else []), *(["--seed", seed] if seed else [])]
              for t, p, seed in itertools.product(("0", "0.7"), (None, "0.9"), (None, "7"))]
    argvs += [["--drafter", str(tmp_path), "--no-drafter"], ["--drafter", str(tmp_path)], ["--no-context-graph"],
              ["--graph", "1", "--no-context-graph"], ["--beam-width", "100", "--beam-length", "16"],
              ["--tree", "5000"], ["--lookup", "5000"]]
    refusals = 0
    for argv in argvs:
        chat, library = refused(main, argv, capsys), refused(cli_main.main, [*argv, "hi"], capsys)
        if library is None:  # what both accept, or the chat's own graph rule
            assert chat in (None, GRAPH_NEEDS_TREE), (argv, chat)
        else:
            assert chat == library, argv
            refusals += 1
    assert 0 < refusals < len(argvs)  # the combinations tried hold both answers


def test_help_and_a_value_typed_wrong_answer_without_the_library(capsys):
    """--help and the argparse types' errors answer without importing the library (and MLX with it: seconds of a
    blank terminal on a cold start); the types take and refuse what redrafter_mlx.cli's do, in their words."""
    import subprocess

    from redrafter_mlx import cli

    code = ("import sys\nfrom app.__main__ import main\n"
            "for argv in (['--help'], ['--seed', '-1'], ['-W', 'x'], ['--top-p', '2']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('redrafter_mlx', 'mlx'))), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert out.stderr.splitlines()[-1] == "[]", out.stderr
    chat = configure_parser()
    huge = str(-10**70)  # (echoed in 3 significant digits: errors.compact and its twin app.engine.compact)
    past = "1" * 4301  # past the 4300 digits int() reads: echoed so too (errors.compact_digits and its twin)
    for flag, kind, values in (("--beam-width", cli.positive, ("0", "-3", "x", "1.5", "inf", huge, past, "-" + past,
                                                                "x" * 5000)),
                               ("--lookup", cli.non_negative, ("-1", "x", huge, past, "0" * 5000 + "7")),
                               ("--max-tokens", cli.positive, ("0",)),
                               ("--temperature", cli.temperature, ("-0.1", "nan", "inf", "x", "1" * 400)),
                               ("--top-p", cli.probability, ("0", "1.5", "nan")),
                               ("--tree-min-prob", cli.probability, ("0", "-1")),
                               ("--seed", cli.seed, ("-1", str(2**64), "1.5", huge, str(10**70), past, "-" + past))):
        library = cli.Parser(prog="redrafter-chat")
        library.add_argument(flag, type=kind)
        for value in (*values, "1"):
            said = []
            for parser in (chat, library):
                try:
                    parser.parse_args([flag, value])
                    said.append(None)
                except SystemExit:
                    said.append(capsys.readouterr().err.split(" (options")[0].split(": ", 3)[-1])  # less the flag
            assert said[0] == said[1], (flag, value, said)
    from app.engine import compact as twin
    from redrafter_mlx.errors import compact

    for n in (0, -7, 2**64, 10**20 - 1, 10**20, -10**50, 4 * 10**70 - 4, 123456789012345678901234, 10**5000):
        assert twin(n) == compact(n), n
    from app.engine import compact_digits as twin
    from redrafter_mlx.errors import compact_digits

    for negative, digits in ((False, "7"), (True, "1" * 20), (False, "9" * 5000), (True, "123" + "0" * 4400)):
        assert twin(negative, digits) == compact_digits(negative, digits), digits[:30]


def test_quitting_while_the_model_loads_leaves_at_once(monkeypatch):
    """Ctrl+Q while the model loaded left the shell waiting for the load to reach its next stage (8-10 s
    seen, the chat gone): main() now leaves at once, by os._exit as after a step that outlasts its wait.
    After the load it still waits for the engine (a cancelled reply ends within a step)."""
    import asyncio
    import os

    import app.app as app_module
    from app.__main__ import ENGINE_EXIT_SECONDS, main

    waited, exited = [], []

    class Recorded(FakeEngine):
        def wait(self, timeout):
            waited.append(timeout)
            return super().wait(min(timeout, 5))

    def quit_with_ctrl_q(loaded: bool):
        def create(engine, settings):
            app = create_app(engine, settings)

            async def drive():
                async with app.run_test(size=SIZE) as pilot:
                    await (ready(pilot) if loaded else pilot.pause())
                    assert app.status == ("ready" if loaded else "loading")
                    await pilot.press("ctrl+q")

            app.run = lambda: asyncio.run(drive())
            return app

        monkeypatch.setattr(app_module, "create_app", create)

    monkeypatch.setattr("app.__main__.has_terminal", lambda: True)
    monkeypatch.setattr(os, "_exit", exited.append)
    gate = threading.Event()  # the load is held until the test ends
    engine = Recorded(load_gate=gate)
    monkeypatch.setattr("app.__main__.Engine", lambda *a, **k: engine)
    quit_with_ctrl_q(loaded=False)
    try:
        assert main([]) == 0
        assert waited == [0] and exited == [0] and not gate.is_set()  # left with the load still running
    finally:
        gate.set()
        assert engine.wait(10)
    waited.clear(), exited.clear()
    monkeypatch.setattr("app.__main__.Engine", lambda *a, **k: Recorded())
    quit_with_ctrl_q(loaded=True)
    assert main([]) == 0
    assert waited == [ENGINE_EXIT_SECONDS] and exited == []


def test_ctrl_c_while_waiting_for_the_engine_after_quitting_ends_with_one_line(capsys, monkeypatch):
    """After the chat's screen closes, main() waits up to ENGINE_EXIT_SECONDS for the engine to end its step:
    Ctrl+C then printed a KeyboardInterrupt traceback from inside the wait. It says "cancelled" on a line of its
    own, status 130, and leaves without tearing the runtime down around the engine's thread (os._exit)."""
    import os

    import app.app as app_module
    import app.__main__ as chat_main

    class Interrupted(FakeEngine):
        def wait(self, timeout):
            raise KeyboardInterrupt

    class Quit:  # the chat, quit after its model loaded
        load_error = load_details = None
        status, return_code = "ready", 0

        def run(self):
            pass

    exited = []
    monkeypatch.setattr(app_module, "create_app", lambda engine, settings: Quit())
    monkeypatch.setattr(chat_main, "has_terminal", lambda: True)
    monkeypatch.setattr(chat_main, "Engine", lambda *a, **k: Interrupted())
    monkeypatch.setattr(os, "_exit", exited.append)
    try:
        status = chat_main.main([])
    except KeyboardInterrupt:  # (a failure, not pytest's own Ctrl+C, which ends the whole run)
        pytest.fail("Ctrl+C while waiting for the engine ended the chat with a traceback")
    assert exited == [130] and status == 130
    assert capsys.readouterr().err == "\nredrafter-chat: cancelled\n"


async def test_a_paste_with_carriage_returns_keeps_every_line():
    """Terminals send a pasted text's line breaks as carriage returns (VTE, xterm, iTerm2, Windows Terminal:
    what Enter sends), which the prompt box did not take for line breaks: Input's own paste kept the first
    line and dropped the rest (a paste that began with a break, nothing). Every line break str.splitlines()
    knows now shows as ⏎ and is sent as one."""
    engine = FakeEngine(["ok"])
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.query_one(PromptInput)
        for pasted in ("Fix this:\rdef f():\r    return 1\r", "Fix this:\r\ndef f():\r\n    return 1",
                       "Fix this:\u2028def f():\x0b    return 1"):
            box.value = ""
            assert await paste(pilot, pasted) == "Fix this:⏎def f():⏎    return 1", repr(pasted)
        box.value = ""
        assert await paste(pilot, "\r\rone line\r") == "one line"  # Input's paste kept the first line: none at all
        box.value = "Fix this:⏎def f():⏎    return 1"
        await pilot.press("enter")
        await finished(pilot)
        assert engine.calls[-1][0][-1]["content"] == "Fix this:\ndef f():\n    return 1"


async def test_a_known_command_with_bad_arguments_says_how_it_is_written():
    """A known /command with wrong arguments read "Unknown command '/beam 2'", and a beam typed out of range
    (/beam 0 0, /width 99) was clamped without a word (0 x 0 became 1 x 1, plain decoding). Each now gets one
    notice: how the command is written, or the limits; the settings stay as they were."""
    engine = FakeEngine(["Sure."])
    app = create_app(engine, Settings(adaptive=False, beam_width=3, beam_length=4))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        expected = {
            "/beam 2": "/beam is written /beam W L", "/beam a b": "/beam is written /beam W L",
            "/beam 3 4 5": "/beam is written /beam W L", "/width": "/width is written /width N",
            "/length 2.5": "/length is written /length N", "/spec maybe": "/spec is written /spec, /spec on",
            "/auto now": "/auto is written /auto", "/new chat": "/new is written /new", "/stats x": "/stats is",
            "/beam 0 0": "A beam width is 1 to 16, not 0", "/width 99": "A beam width is 1 to 16, not 99",
            "/length -1": "A beam length is 1 to 16, not -1", "/nosuch": "Unknown command '/nosuch'",
            f"/width {10**70}": "A beam width is 1 to 16, not 1e+70:",  # (its 71 digits were echoed)
        }
        for line, said in expected.items():
            before = len(app._notifications)
            await ask(pilot, line)
            await pilot.pause()
            new = [str(n.message) for n in list(app._notifications)[before:]]
            assert len(new) == 1 and said in new[0], (line, new)
            assert (app.settings.beam_width, app.settings.beam_length, app.settings.adaptive) == (3, 4, False)
            assert app.settings.speculative and not engine.calls and engine.new_chats == 0
        await ask(pilot, "/beam 16 1")  # the limits themselves are taken
        assert (app.settings.beam_width, app.settings.beam_length) == (16, 1)


async def test_a_beam_set_while_the_model_loads_is_kept():
    """F5-F8 or /beam while the model loaded said "Beam: 5 x 4 ... fixed", and then the load put the tuned
    shape over it (3 x 5, the tree too) without a word. The shape the user chose is kept now, as -W/-L are."""
    gate = threading.Event()
    engine = FakeEngine(["Sure."], beam_shape=(3, 5), tree=12, load_gate=gate)
    app = create_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f6")  # 4 x 4 -> 5 x 4
        assert (app.settings.beam_width, app.settings.beam_length, app.settings.adaptive) == (5, 4, False)
        gate.set()
        await ready(pilot)
        assert (app.settings.beam_width, app.settings.beam_length, app.settings.tree) == (5, 4, None)
        assert "5 × 4 (width × length)" in panel(app)


async def test_escape_sequences_in_a_message_are_shown_not_sent_to_the_terminal():
    """A reply (or a pasted message) holding an escape sequence reached the terminal as written (Textual strips
    only BEL, BS, VT, FF and CR): "\x1b[2J" cleared the screen mid-draw, an unterminated "\x1b]0;" swallowed
    what came after. They show as control pictures (␛); the conversation keeps the text as the model gave it."""
    reply = "Red: \x1b[31mred\x1b[0m, clear: \x1b[2J, title: \x1b]0;x\x07, c1: \x9b1m. Done."
    app = create_app(FakeEngine([reply]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "say \x1b[2J")
        await finished(pilot)
        drawn = []
        for widget in (app.query_one(UserMessage), *app.query_one(AssistantMessage).query("*")):
            for y in range(widget.size.height):
                drawn.append("".join(segment.text for segment in widget.render_line(y)))
        drawn = "\n".join(drawn)
        assert not any(ch in drawn for ch in "\x1b\x07\x9b")
        assert "say ␛[2J" in drawn and "Red: ␛[31mred␛[0m, clear: ␛[2J, title: ␛]0;x␇, c1: �1m. Done." in drawn
        assert app.messages[-1] == {"role": "assistant", "content": reply}  # (what the model gave, for the cache)
        assert app.messages[0]["content"] == "say \x1b[2J"


def drawn_lines(*widgets) -> str:
    """The text of the lines `widgets` draw, as the terminal gets it."""
    lines = []
    for widget in widgets:
        for y in range(widget.size.height):
            lines.append("".join(segment.text for segment in widget.render_line(y)))
    return "\n".join(lines)


async def test_escape_sequences_in_the_prompt_box_the_panel_and_notices_are_shown_not_sent():
    """Past the bubbles, an escape sequence still reached the terminal as written from the prompt box (a pasted
    one), the panel's --system row and the notices (a load error quoting a file name or a library's words). They
    show as control pictures there too; what the box sends is what was pasted."""
    app = create_app(FakeEngine(), Settings(system="be \x1b[2Jbrief"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.query_one(PromptInput)
        await paste(pilot, "a \x1b]0;title\x07 b\x9b")
        await pilot.pause()
        drawn = drawn_lines(box, app.query_one(StatsPanel))
        assert not any(ch in drawn for ch in "\x1b\x07\x9b")
        assert "a ␛]0;title␇ b�" in drawn and "be ␛[2Jbrief" in drawn
        assert box.cursor_position == len(box.value) == len("a \x1b]0;title\x07 b\x9b")  # (one mark a character)
        await pilot.press("enter")
        await finished(pilot)
        assert app.messages[0]["content"] == "a \x1b]0;title\x07 b\x9b"
    app = create_app(FakeEngine(fail_load="no model at ./\x1b[2Jx:\nfile\x1b[31m gone"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.status == "load failed")
        await pilot.pause()
        drawn = drawn_lines(*app.query(Notice))
        assert "\x1b" not in drawn and "./␛[2Jx:" in drawn



async def test_the_prompt_box_scrolls_to_its_cursor_past_control_characters():
    """The box counted an ESC as 0 cells wide (in the value) where it draws ␛, 1 cell: with a pasted escape
    sequence, the end of a long message (and the cursor there) stayed out of sight past the box's right edge, and a
    click put the cursor as many characters further as control characters came before it."""
    app = create_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.query_one(PromptInput)
        await paste(pilot, "\x1b" * 60 + "x" * 99 + "y")
        await pilot.press("left", "right")  # (Textual scrolls the box as the cursor moves)
        await pilot.pause()
        assert box.cursor_position == len(box.value) == 160
        drawn = drawn_lines(box)
        assert "y" in drawn and drawn.count("␛") < 60
        box.value = "\x1b" * 10 + "abcdefghijkl"
        await pilot.press("home")
        await pilot.pause()
        gutter = box.content_region.x - box.region.x
        await pilot.click(PromptInput, offset=(gutter + 11, box.content_region.y - box.region.y))
        assert box.cursor_position == 11  # the click on the drawn "b" (it went to "l", 10 cells further)


async def test_a_model_name_with_an_escape_sequence_is_shown_not_sent_in_the_header():
    """The header's subtitle (the model's name: a folder's or a file's, as the user named it) was drawn as written."""
    from textual.widgets import Header

    app = create_app(FakeEngine(model="fake\x1b]0;x"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.pause()
        drawn = "\n".join(drawn_lines(w) for w in app.query_one(Header).query("*"))
        assert "\x1b" not in drawn and "fake␛]0;x" in drawn


async def test_html_in_a_reply_is_shown_as_written():
    """Textual's Markdown drops raw HTML it cannot draw: a reasoning model's <think> block vanished whole
    (Qwen3 is in the registry), and "<b>42</b>" or "<br>" lost their tags, so the reply on screen was not
    the one the conversation keeps (and Ctrl+Y copies). HTML is shown as the model wrote it."""
    from textual.widgets._markdown import MarkdownParagraph

    reply = "<think>\nSix times seven.\n</think>\n\nThe answer is <b>42</b>; a <br> breaks a line, `<p>` too."
    app = create_app(FakeEngine([reply]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "What is 6 x 7?")
        await finished(pilot)
        shown = [p.render().plain for p in app.query_one(AssistantMessage).query(MarkdownParagraph)]
        assert shown == ["<think> Six times seven. </think>", "The answer is <b>42</b>; a <br> breaks a line, <p> too."]
        assert app.messages[-1]["content"] == reply


def test_the_readmes_chat_section_names_every_option():
    """The README's Chat section gave six of redrafter-chat's sixteen options (no --temperature, --top-p,
    --max-tokens or --system, none of the drafting ones): a reader of it did not learn the chat takes them."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("\n## Chat\n", 1)[1].split("\n## ", 1)[0]
    options = [max(a.option_strings, key=len) for a in configure_parser()._actions if a.option_strings]
    assert [o for o in options if o != "--help" and o not in section] == []


def test_a_model_without_a_chat_template_is_said(tiny_kit, tmp_path):
    """A model with no chat template gets the conversation as plain text (its turns joined by line breaks),
    and continues it rather than answering; redrafter-train notes it, the chat said nothing."""
    import json

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    for template in path.glob("chat_template*"):
        template.unlink()
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for folder, said in ((path, True), (tiny_kit.write_folder(tmp_path / "chat", tiny_kit.model(seed=0)), False)):
        engine = Engine(str(folder), warm_up=False, use_drafter=False)
        try:
            notices = engine.load(lambda stage, text: None).notices
            assert any("has no chat template: the conversation reaches it as plain text" in n for n in notices) == said
        finally:
            engine.close()
            engine.wait(10)


def test_the_library_never_imports_the_app_or_textual():
    """Imports point one way: app -> redrafter_mlx. A library module that imported app or textual would make
    every API user, bench and training run depend on the chat's UI (and tie its import time to Textual's)."""
    import ast
    from pathlib import Path

    library = Path(__file__).resolve().parents[1] / "redrafter_mlx"
    found = []
    for path in sorted(library.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("app", "convert", "textual")]
    assert found == []


def test_a_system_prompt_that_is_not_text_is_refused_while_parsing(monkeypatch, capsys):
    """--system given in bytes that are not UTF-8 (a Latin-1 terminal's "é") reaches Python with lone
    surrogates, which the tokenizer refuses: the chat opened, loaded the model, and every reply failed."""
    import app.app as app_module
    from app.__main__ import main

    monkeypatch.setattr(app_module, "create_app", lambda *a: pytest.fail("the chat opened"))
    monkeypatch.setattr("app.__main__.has_terminal", lambda: True)
    with pytest.raises(SystemExit) as e:
        main(["--system", b"R\xe9ponds en fran\xe7ais".decode("utf-8", "surrogateescape")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--system is not valid text" in err and err.count("\n") == 1


async def test_a_stats_value_too_long_for_its_column_wraps_under_itself():
    """The panel was one text: a value longer than its column went on at the panel's left edge, under the
    labels ("(plain)" and "64 3.0×" below "decoding" and "cost model", rows of the default adaptive mode).
    It wraps under its own column now."""
    from textual.geometry import Region

    app = create_app(FakeEngine([REPLY]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "hi")
        await finished(pilot)
        stats = app.query_one(StatsPanel)
        lines = [strip.text[2:].rstrip() for strip in stats.render_lines(Region(0, 0, *stats.size))]
        decoding = next(i for i, line in enumerate(lines) if line.startswith("decoding "))
        assert lines[decoding + 1] == " " * 13 + "(plain)"  # 48 columns: "adaptive · 0% of steps parked" first
        assert not any(line.startswith(("(plain)", "64 ")) for line in lines)


async def test_the_session_panel_shows_the_system_prompt():
    """--system is read by the model before every conversation (new chats included), and nothing on screen
    said one was in effect: the Session panel shows it (cut to one line), or the template's default."""
    long = "You are a terse assistant. Answer in one sentence, and never use lists or headings at all."
    for system, shown in ((None, "the chat template's default"), ("  ", "the chat template's default"),
                          ("Answer\nbriefly.", "“Answer briefly.”"), (long, "“" + long[:59].rstrip() + "…”")):
        app = create_app(FakeEngine(["x"]), Settings(system=system))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            assert f"system       {shown}" in panel(app)


def test_an_app_that_ended_on_an_error_exits_with_status_1(monkeypatch):
    """Textual prints an error that ends the app and sets its return code to 1; redrafter-chat exited 0
    all the same, so a shell or script took the crash for a quit."""
    import app.app as app_module
    from app.__main__ import main

    class Ended:
        load_error, status = None, "ready"

        def __init__(self, code):
            self.return_code = code

        def run(self):
            pass

    monkeypatch.setattr("app.__main__.has_terminal", lambda: True)
    for code, status in ((1, 1), (0, 0), (None, 0)):
        monkeypatch.setattr(app_module, "create_app", lambda *a, code=code: Ended(code))
        assert main(["--model", "org/nope"]) == status


def test_the_chat_takes_a_seed_as_the_other_tools_do(monkeypatch, capsys):
    """redrafter-chat had no --seed. It takes the other tools' range, says their words out of it and with
    --temperature 0 (their rule, over every combination), and hands the seed to every reply."""
    import itertools

    from app.__main__ import main, settings_from
    from redrafter_mlx import cli
    from redrafter_mlx.sampling import SEED_MAX

    p = configure_parser()
    assert p.parse_args(["--temperature", "1", "--seed", str(SEED_MAX)]).seed == SEED_MAX
    for bad in ("-1", str(SEED_MAX + 1), "1.5"):
        with pytest.raises(SystemExit):
            p.parse_args(["--seed", bad])
        err = capsys.readouterr().err
        with pytest.raises(SystemExit):
            parser = cli.Parser(prog="redrafter-chat")
            parser.add_argument("--seed", type=cli.seed)
            parser.parse_args(["--seed", bad])
        assert err.split("(options")[0] == capsys.readouterr().err.split("(options")[0], bad
    monkeypatch.setattr("app.__main__.has_terminal", lambda: False)  # main() ends there when nothing is refused
    for temperature, top_p, seed in itertools.product(("0", "0.7"), (None, "0.9"), (None, "7")):
        argv = ["--temperature", temperature, *(["--top-p", top_p] if top_p else []),
                *(["--seed", seed] if seed else [])]
        a = p.parse_args(argv)
        library = cli.sampling_error(a.temperature, a.top_p, a.seed)
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert library in err if library else "the chat needs a terminal" in err, (argv, err)
    assert settings_from(p.parse_args(["--temperature", "0.7", "--seed", "7"])).seed == 7
    assert settings_from(p.parse_args([])).seed is None


def test_the_engine_draws_a_reply_with_the_seed_and_says_the_seed_it_drew(tiny_kit, tmp_path):
    """The chat's replies were drawn with a fresh seed that nothing showed: the engine's stats carry the
    seed each sampled reply used (the given one, or the one it drew), which gives the reply again."""
    from redrafter_mlx import generate, load

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    engine = Engine(str(path), warm_up=False)
    try:
        engine.load(lambda stage, text: None)
        messages = [{"role": "user", "content": "the a the"}]

        def reply(settings):
            chunks = list(engine.reply(messages, settings, lambda: False))
            engine.new_chat()
            return "".join(c.text for c in chunks), chunks[-1].stats.seed

        text, seed = reply(Settings(max_tokens=16, temperature=1.5))
        assert isinstance(seed, int)
        assert reply(Settings(max_tokens=16, temperature=1.5, seed=seed)) == (text, seed)
        assert reply(Settings(max_tokens=16, temperature=1.5, seed=seed, speculative=False)) == (text, seed)
        assert generate(load(str(path)), messages, max_tokens=16, temperature=1.5, seed=seed).text == text
        assert reply(Settings(max_tokens=4))[1] is None  # greedy
    finally:
        engine.close()
        engine.wait(10)


async def test_seed_command_draws_later_replies_with_a_seed_as_the_option_does():
    """A later reply drawn with a fresh seed could be drawn again only through the library: /seed N draws every
    later reply with N (what --seed N does from the start), /seed says the last reply's seed and the one fixed,
    /seed off draws a fresh one again; a seed out of --seed's range, or with greedy decoding (which --seed is
    refused with), leaves the settings as they were, saying why."""
    from app.engine import FAKE_SEED, SEED_MAX

    def said(app):
        return str(list(app._notifications)[-1].message)

    engine = FakeEngine(["One.", "Two.", "Three."])
    app = create_app(engine, Settings(temperature=0.7))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "/seed")
        assert said(app) == "No sampled reply yet. Each reply draws a fresh seed."
        await ask(pilot, "first")
        await finished(pilot)
        await ask(pilot, "/seed")
        assert said(app).startswith(f"The last reply was drawn with seed {FAKE_SEED}: /seed {FAKE_SEED} draws")
        for bad, words in ((str(SEED_MAX + 1), "A seed is from 0 to 2**64 - 1, not"), ("-1", "not -1"),
                           ("1.5", "/seed is written /seed N (0 to 2**64 - 1)"), ("1 2", "/seed is written"),
                           (str(-10**70), "2**64 - 1, not -1e+70:")):
            await ask(pilot, f"/seed {bad}")
            assert words in said(app) and app.settings.seed is None, bad
        await ask(pilot, f"/seed {SEED_MAX}")
        assert app.settings.seed == SEED_MAX and said(app).startswith(f"Seed {SEED_MAX}: every reply is drawn")
        assert f"  seed       {SEED_MAX}" in panel(app).splitlines()
        await ask(pilot, "second")
        await finished(pilot)
        assert engine.calls[-1][1].seed == SEED_MAX and f"seed         {SEED_MAX}" in panel(app).splitlines()
        await ask(pilot, "/seed")
        assert f"Every reply is drawn with seed {SEED_MAX}" in said(app)
        await ask(pilot, "/seed off")
        assert app.settings.seed is None and said(app).startswith("Seed off")
        await ask(pilot, "third")
        await finished(pilot)
        assert engine.calls[-1][1].seed is None
    app = create_app(FakeEngine(["x"]), Settings())  # greedy: a seed changes nothing, as --seed says
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "/seed 7")
        assert app.settings.seed is None and "--temperature 0 decodes greedily" in said(app)
    assert "/seed N" in HELP and "/seed N" in configure_parser().format_help()


async def test_the_stats_panel_shows_the_seed_of_a_sampled_reply():
    from app.engine import FAKE_SEED

    for settings, shown in ((Settings(temperature=0.7), FAKE_SEED), (Settings(temperature=0.7, seed=42), 42)):
        app = create_app(FakeEngine([REPLY]), settings)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await ask(pilot, "What is speculative decoding?")
            await finished(pilot)
            lines = panel(app).splitlines()
            assert f"seed         {shown}" in lines
            assert ("  seed       42" in lines) == (settings.seed is not None)
    app = create_app(FakeEngine([REPLY]), Settings())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "What is speculative decoding?")
        await finished(pilot)
        assert "seed" not in panel(app)  # greedy: no draw
