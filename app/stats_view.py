"""What the stats panel says: (label, value) rows computed from the engine's snapshots.

Pure functions and one small accumulator (`Baseline`), no Textual: the panel widget only
lays these rows out, and tests can read them directly. The labels `tok/s`, `tokens/step`
and `acceptance` are the ones the library's bench and CLI print.

Speedup is measured, not assumed: speculative tok/s over plain decoding's tok/s, where the
plain figure comes from this session's plain replies (all of them, token-weighted) or, until
there is one, for an adaptive reply from the controller's own timing of plain steps (it times
them as it decodes), else from the short plain run the engine makes while warming up.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .engine import COPY_GROWTH, EngineInfo, Settings, Stats

SPARK = "▁▂▃▄▅▆▇█"
SPARK_STEPS = 24  # steps shown in the sparkline
BAR_WIDTH = 16
MIN_PLAIN_STEPS = 4  # plain replies shorter than this are too noisy to time

Row = Tuple[str, Optional[str]]  # (label, value); value None: a section heading


@dataclass
class Baseline:
    """Plain decoding speed, for the speedup figure."""

    calibration: Optional[float] = None  # tok/s of the engine's warm-up run
    plain_tokens: int = 0
    plain_seconds: float = 0.0
    plain_replies: int = 0

    def observe(self, stats: Stats):
        """Count a finished reply if it was decoded plainly and long enough to time."""
        if stats.mode == "ar" and stats.steps >= MIN_PLAIN_STEPS and stats.decode_seconds > 0:
            self.plain_tokens += stats.new_tokens - 1  # the decode steps' tokens (the prefill's is not timed)
            self.plain_seconds += stats.decode_seconds
            self.plain_replies += 1

    @property
    def tokens_per_second(self) -> Optional[float]:
        if self.plain_seconds > 0:
            return self.plain_tokens / self.plain_seconds
        return self.calibration

    @property
    def source(self) -> str:
        if self.plain_seconds > 0:
            n = self.plain_replies
            return f"{n} plain repl{'y' if n == 1 else 'ies'}"
        return "warm-up run" if self.calibration else ""


def sparkline(values: Sequence[int], top: int) -> str:
    top = max(top, max(values, default=0), 1)
    return "".join(SPARK[min(len(SPARK) - 1, round(v / top * (len(SPARK) - 1)))] for v in values)


def histogram(values: Sequence[int], top: int) -> List[Row]:
    """One bar per length 1..top (a beam's lengths, zeros included), then per longer length that occurred:
    how many steps emitted that many tokens. (A copied run makes steps of up to 4 x lookup + 1 tokens: one
    row per length up to the longest gave 33 rows for one step of 33, most of them "· 0", and pushed the
    rest of the panel out of sight.)"""
    if not values:
        return []
    longest = max(max(values), top, 1)
    counts = [sum(1 for v in values if v == n) for n in range(1, longest + 1)]
    most = max(counts) or 1
    return [
        (f"  {n} tok", ("█" * round(c / most * BAR_WIDTH) or ("▏" if c else "·")) + f" {c}")
        for n, c in enumerate(counts, start=1) if c or n <= max(top, 1)
    ]


def _short_path(path: str) -> str:
    parts = Path(path).parts
    return str(Path(*parts[-2:])) if len(parts) > 2 else path


SYSTEM_SHOWN = 60  # characters of --system the panel shows


def _system_prompt(system: Optional[str]) -> str:
    """The system prompt as the panel shows it: on one line, cut to SYSTEM_SHOWN characters."""
    text = " ".join((system or "").split())
    if not text:  # (redrafter_mlx.tokenizer takes a blank one for none)
        return "the chat template's default"
    return f"“{text}”" if len(text) <= SYSTEM_SHOWN else f"“{text[:SYSTEM_SHOWN - 1].rstrip()}…”"


def speculative_state(info: Optional[EngineInfo], settings: Settings) -> str:
    if not settings.speculative:
        return "off"
    if info is not None and info.drafter is None:
        return "on (context lookup only: no drafter)"
    return "on"


def counted(n: int, noun: str) -> str:
    """'1 token', '2 tokens' (the panel said "1 tokens read", "1 tokens · 1 steps")."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def reply_rows(stats: Optional[Stats], baseline: Baseline, status: str) -> List[Row]:
    rows: List[Row] = [("Reply", None), ("status", status)]
    if stats is None:
        return rows + [("tok/s", "—"), ("tokens/step", "—"), ("acceptance", "—")]
    spec = stats.mode in ("redrafter", "auto")
    tree = f" tree {stats.tree}" if stats.tree else ""
    if stats.mode == "auto":
        rows.append(("decoding", f"adaptive · {stats.parked_share:.0%} of steps parked (plain)"))
    elif spec and stats.beam_length == 1:  # no drafter beams: the context's copy alone (it read "1×1")
        rows.append(("decoding", "speculative · the context's copy alone"))
    else:
        rows.append(("decoding", f"speculative {stats.beam_width}×{stats.beam_length}{tree}" if spec else "plain"))
    rows.append(("tok/s", f"{stats.tokens_per_second:.1f}" if stats.steps else "—"))
    per_step = f"{stats.last_step_tokens} last · {stats.tokens_per_step:.2f} mean"
    rows.append(("tokens/step", per_step if stats.steps else "—"))
    accepted = f"{stats.acceptance:.0%} ({counted(stats.accepted_tokens, 'draft')} accepted)"
    if stats.mode == "auto" and stats.steps and stats.parked_share >= 1.0:
        accepted = "— (nothing drafted: every step plain)"  # it said "0% (0 drafts accepted)"
    rows.append(("acceptance", accepted if spec and stats.steps else "—"))
    base, source = baseline.tokens_per_second, baseline.source
    plain_ms = (stats.controller or {}).get("plain_ms") or 0.0
    if stats.mode == "auto" and plain_ms > 0 and not baseline.plain_replies:
        # The controller times this session's plain steps as it goes: a far steadier baseline than the
        # warm-up's 8 tokens (one session's warm-up read 14.9 tok/s, another's 5.0: a parked reply showed
        # 1.80x in one, 0.56x in the other).
        base, source = 1000.0 / plain_ms, "timed plain steps"
    if not spec:
        rows.append(("speedup", "1.00× (plain decoding)"))
    elif base and stats.steps:
        rows.append(("speedup", f"{stats.tokens_per_second / base:.2f}×"))
    else:
        rows.append(("speedup", "—" if base else "— (no plain baseline yet)"))
    if base:
        rows.append(("  vs plain", f"{base:.1f} tok/s ({source})"))
    if spec and stats.steps:
        rows.append(("verified", f"{stats.packed_per_step:.1f} tokens/step"))
    if stats.controller:
        c = stats.controller
        rows.append(("cost model", f"plain {c.get('plain_ms', 0):.0f} ms · 16 tokens {c.get('x16', 0):.1f}× · "
                                   f"64 {c.get('x64', 0):.1f}×"))
    if spec and stats.accepted_lengths:
        # Draft tokens accepted per step (a step's tokens but the base model's own), on one scale for the whole
        # reply: the most a beam accepts, or the reply's longest step. Scaled to the recent steps alone (an
        # adaptive reply has no beam length), 24 plain steps drew full bars, "████", as if every draft held.
        recent = stats.accepted_lengths[-SPARK_STEPS:]
        top = max(stats.beam_length, max(stats.accepted_lengths)) - 1
        rows.append(("accepted", sparkline([max(n - 1, 0) for n in recent], top)))
        rows.extend(histogram(stats.accepted_lengths, stats.beam_length))
    if spec and stats.decode_seconds > 0:
        d, v = stats.draft_seconds / stats.decode_seconds, stats.verify_seconds / stats.decode_seconds
        rows.append(("draft/verify", f"{d:.0%} / {v:.0%} of decode"))
    # the seconds are those of the tokens read: the ones the KV cache held from the turns before are not
    # (it read "0.05 s · 1500 tokens" on a later turn, an impossibly fast prefill)
    read = stats.prompt_tokens - stats.cached_tokens
    rows.append(("prefill", f"{stats.prefill_seconds:.2f} s · {counted(read, 'token')}"
                 + (f" read + {stats.cached_tokens:,} cached" if stats.cached_tokens else "")))
    rows.append(("peak memory", f"{stats.peak_memory_mb:,.0f} MB"))
    rows.append(("generated", f"{counted(stats.new_tokens, 'token')} · {counted(stats.steps, 'step')}"))
    if stats.seed is not None:  # the fresh seed a sampled reply drew was shown nowhere: it could not be had again
        rows.append(("seed", str(stats.seed)))
    return rows


def session_rows(info: Optional[EngineInfo], settings: Settings, failed: bool = False,
                 used: Optional[int] = None) -> List[Row]:
    """failed: the load failed (the panel said "loading…" beside a status of "load failed"). used: the tokens the
    conversation holds, prompt and reply, as of the last reply (the panel gave the context's size alone, and a
    conversation ran into "context full" with no warning)."""
    rows: List[Row] = [("Session", None)]
    if info is None:
        return rows + [("model", "did not load (the reason is in the chat)" if failed else "loading…")]
    weights = info.weight_format + (f" (stored {info.stored_format})" if info.stored_format else "")
    rows += [
        ("model", info.model),
        ("drafter", _short_path(info.drafter) if info.drafter else "none: context lookup or plain decoding"),
        ("weights", weights),
        ("device", info.device),
        ("speculative", speculative_state(info, settings)),
        ("beam", "adaptive (sized each step to this machine)" if settings.adaptive
                 else (f"none: the copy alone, {settings.lookup} tokens (up to {settings.lookup * COPY_GROWTH})"
                       if settings.lookup
                       else "none (--lookup 0: plain decoding)") if info.drafter is None
                 else f"{settings.beam_width} × {settings.beam_length} (width × length)"
                 + (f", tree of {settings.tree} nodes" if settings.tree else "")),
        ("sampling", f"temp {settings.temperature:g} · top-p {settings.top_p:g}"),
        *([("  seed", str(settings.seed))] if settings.seed is not None and settings.temperature else []),
        ("max tokens", str(settings.max_tokens)),
        # (the model reads it before every conversation, and nothing on screen said so)
        ("system", _system_prompt(settings.system)),
        ("context", f"{used:,} of {info.context_length:,} tokens used" if used else f"{info.context_length:,} tokens"),
    ]
    return rows


def stats_rows(info: Optional[EngineInfo], settings: Settings, stats: Optional[Stats], baseline: Baseline,
               status: str) -> List[Row]:
    used = stats.prompt_tokens + stats.new_tokens if stats is not None else None
    return (reply_rows(stats, baseline, status) + [("", "")]
            + session_rows(info, settings, status == "load failed", used))


def as_text(rows: List[Row], label_width: int = 13) -> str:
    """Plain-text layout of the rows (what the panel shows, without colours)."""
    lines = []
    for label, value in rows:
        lines.append(label if value is None else f"{label:<{label_width}}{value}".rstrip())
    return "\n".join(lines)
