"""Context lookup: one extra draft beam copied from the text so far ("prompt lookup decoding").

Replies often repeat what is already in the context: names and phrases from the prompt, code
being edited, a list's own pattern, or the model's own loops. When the last n tokens of the
context (the cached ids plus the root token) also occur earlier, the tokens that followed
that earlier occurrence are a cheap, often long, draft. Generation adds it as one more beam
next to the drafter's; the packed tree merges it with any beam sharing its prefix, and
verification accepts it only where the base model agrees, so output stays exactly the
base model's.

n runs from `max_ngram` down to `min_ngram` (the longest n-gram found wins); min_ngram 2 keeps
single-token matches out (on MT-Bench replies they proposed about three tokens for every one
accepted). Of that n-gram's last CANDIDATES occurrences the copy follows the one whose match
runs furthest back (the latest among equals), and a match reports that length, its *extent*
(up to EXTENT tokens): a reply quoting a passage matches it far back, a common phrase only by
its few tokens. Along greedy replies to 128 training prompts (not MT-Bench) of the default
model, a copy's first token was right 59% of the time at extent 2 and 93% past 16, and its
accepted run averaged 2.3 against 16 tokens (graph.CONTEXT_PRIOR). Picking the furthest-back
occurrence over the latest raised tokens/step 1.0% on those prompts, 1.1% on MT-Bench's first
turns and 3.6% on its second, at fewer packed tokens (replay, the shipped CPU tree).
"""

from typing import NamedTuple, Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAX_NGRAM = 3
MIN_NGRAM = 2
CANDIDATES = 8  # occurrences of the matched n-gram compared by extent (the latest ones)
EXTENT = 33  # how far back a match is measured, in tokens (33: "more than 32")


class Match(NamedTuple):
    """A context lookup's answer: the copy, the n-gram length n that matched (0: none) and the
    extent, how many tokens before the copy equal the key's last ones (>= n; at most EXTENT)."""

    copy: np.ndarray
    n: int
    extent: int


NO_MATCH = Match(np.zeros(0, dtype=np.int32), 0, 0)


def extent(context, end: int, key, n: int) -> int:
    """How many tokens of `context` before position `end` equal the last ones of `key` (a list),
    given that the last n do; at most len(key). Compared in slices, as a loop repeats for
    tens of tokens."""
    L, limit = n, min(len(key), end)
    K = len(key)
    while L < limit:
        s = min(8, limit - L)
        if context[end - L - s : end - L] == key[K - L - s : K - L]:
            L += s
            continue
        while L < limit and context[end - 1 - L] == key[K - 1 - L]:
            L += 1
        return L
    return L


def lookup(ids, length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> np.ndarray:
    """Up to `length` tokens that followed an earlier occurrence of the longest suffix n-gram of
    `ids` (1-D token ids), n = max_ngram .. min_ngram: of its last CANDIDATES occurrences, the
    one matching furthest back (the latest among equals). Empty when none recurs."""
    return lookup_match(ids, length, max_ngram, min_ngram).copy


def lookup_match(ids, length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> Match:
    """`lookup`'s tokens as a Match, found by scanning the whole context (ContextIndex keeps the
    same answer incrementally)."""
    if length < 1:
        return NO_MATCH
    if min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    ids = np.asarray(ids, dtype=np.int32)
    T = ids.size
    key = ids[max(T - EXTENT, 0) :].tolist()
    context = ids.tolist()
    for n in range(min(max_ngram, T - 1), min_ngram - 1, -1):
        windows = sliding_window_view(ids[: T - 1], n)  # (T - n, n): starts 0 .. T-1-n, the suffix itself excluded
        hits = np.flatnonzero((windows == ids[T - n :]).all(axis=1))
        if hits.size:
            L, end = max((extent(context, int(h) + n, key, n), int(h) + n) for h in hits[-CANDIDATES:])
            return Match(periodic(ids, end, length), n, L)
    return NO_MATCH


def periodic(ids, start: int, length: int) -> np.ndarray:
    """`length` tokens that follow position `start` of `ids` if the text repeats with the period
    between that position and the end: ids[start:] and then the same again. A copy that reaches
    the end of the context goes on as the text before it did: in a loop (a model repeating a
    line, a list's pattern) the copy is as long as asked, not cut at the last repeat."""
    tail = np.asarray(ids[start : start + length], dtype=np.int32)  # a slice: no pass over the whole context
    if tail.size >= length or tail.size == 0:
        return tail
    return tail[np.arange(length) % tail.size]


def add_beam(beams: np.ndarray, copy: np.ndarray) -> np.ndarray:
    """The drafter's beams (W, L) plus one row: their root, then `copy` (C,). Rows are padded
    with -1 to max(L, C + 1) columns, which tree.pack reads as the end of a row."""
    W, L = beams.shape
    out = np.full((W + 1, max(L, copy.size + 1)), -1, dtype=np.int32)
    out[:W, :L] = beams
    out[W, 0] = beams[0, 0]
    out[W, 1 : copy.size + 1] = copy
    return out


class ContextIndex:
    """`lookup_match`, kept incrementally for a context that grows step by step: a table per n
    of every n-gram's latest end, so a step costs a few dictionary reads instead of a scan of
    the whole context (which grew to ~0.3 ms a step at 1500 tokens: 5-10% of a GPU's or an
    Apple chip's plain step). The answer equals `lookup_match(ids, length)`'s for any `ids`: a
    context that does not extend the one indexed (a new reply, a truncated chat) is indexed
    anew."""

    def __init__(self, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM):
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._reset()

    def _reset(self):
        self.context: list = []  # the latest context matched (ending with its root)
        self.ids: list = []  # the tokens indexed: every n-gram lying inside them is in a table
        self.ends = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}  # n-gram -> ends of its occurrences

    def _extends(self, ids: list) -> bool:
        k = len(self.ids)
        if k == 0:
            return True
        if len(ids) < k + 1:
            return False
        # Spot checks, not a full comparison (that would cost the scan this class saves); a wrong
        # guess costs only a poorer draft, never a wrong output: verification decides.
        j = max(k - 8, 0)
        return ids[j:k] == self.ids[j:k] and ids[k // 2] == self.ids[k // 2] and ids[k // 4] == self.ids[k // 4]

    def match(self, ids, length: int) -> Match:
        """The Match `lookup_match(ids, length)` gives."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        if not self._extends(ids):
            self._reset()
        self.context = ids
        T = len(ids)
        k = len(self.ids)
        self.ids.extend(ids[k : T - 1])  # the suffix itself stays out, as in lookup_match
        for end in range(k + 1, T):
            for n, table in self.ends.items():
                if end >= n:
                    table.setdefault(tuple(self.ids[end - n : end]), []).append(end)
        if length < 1:  # indexed all the same: `follow` reads this context
            return NO_MATCH
        return self.follow(ids[T - min(EXTENT, T - 1) :], length, self.min_ngram, wrap=True)

    def follow(self, key, length: int, min_ngram: int = MIN_NGRAM, wrap: bool = False) -> Match:
        """Up to `length` tokens that followed, in the context last given to `match`, the longest
        suffix n-gram of `key` (a path's last tokens, up to EXTENT of them), n = max_ngram ..
        max(min_ngram, self.min_ngram): of its last CANDIDATES occurrences the one matching
        furthest back along `key`, the latest among equals. NO_MATCH when none occurs. A min_ngram
        past max_ngram (GSD's k-gram of k + 1 > 3 tokens, graph.context_grafts) is met by the
        max_ngram-gram occurrence whose match runs back at least min_ngram tokens (at most EXTENT:
        a longer one never matches); it had found nothing, so graph=3 and above drafted no context
        graft, saying nothing."""
        key = list(key)
        need = max(min_ngram, self.min_ngram)
        for n in range(min(self.max_ngram, len(key)), min(need, self.max_ngram) - 1, -1):
            ends = self.ends[n].get(tuple(key[len(key) - n :]))
            if ends:
                L, start = max((extent(self.context, e, key, n), e) for e in ends[-CANDIDATES:])
                if L < need:  # (only where need > max_ngram: here L >= n >= need otherwise)
                    return NO_MATCH
                if wrap:
                    return Match(periodic(self.context, start, length), n, L)
                return Match(np.asarray(self.context[start : start + length], dtype=np.int32), n, L)
        return NO_MATCH


GROWTH = 2  # a fully accepted copy makes the next one this many times longer ...
MAX_GROWTH = 4  # ... up to this many times the lookup length asked for


class CopyLength:
    """The lookup copy's length for fixed drafting: `lookup` tokens, doubled after a step that
    accepted the whole copy (the reply is running along text it has seen: extraction, code
    being edited, a quoted list), up to MAX_GROWTH x `lookup`, and back to `lookup` after a
    step that did not. A long copy is verified only while copies keep being accepted, so a
    short one elsewhere costs no more packed tokens than before."""

    def __init__(self, lookup: int, max_growth: int = MAX_GROWTH, limit: Optional[int] = None):
        self.base = self.length = max(int(lookup), 0)
        self.cap = self.base * max(int(max_growth), 1)  # max_growth 1: the copy stays at `lookup`
        if limit is not None:  # a step's draft limit (generate.MAX_DRAFT_TOKENS): lookup 1024 grew to 4096
            self.cap = max(min(self.cap, limit), self.base)

    def update(self, copied: int, taken: int):
        """copied: tokens in this step's copy; taken: how many of them the step accepted (`copy_taken`).
        Only the copy's own acceptance counts: a drafter beam accepted past the copy's length while the
        copy missed grew it (the draft tokens accepted were compared with its length)."""
        if copied and taken >= copied:
            self.length = min(self.length * GROWTH, self.cap)
        else:
            self.length = self.base


def copy_taken(tree, row: int, path) -> int:
    """How many of the copy's tokens the accepted `path` (packed indices, root first) took: the copy is
    row `row` of the beams packed into `tree` (tree.PackedTree; add_beam puts it after the drafter's)."""
    unpacker = tree.unpacker[row]
    n = 0
    while n + 1 < min(len(path), unpacker.size) and unpacker[n + 1] == path[n + 1]:
        n += 1
    return n
