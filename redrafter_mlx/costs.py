"""What a step costs on this machine: t_verify(n), the time to verify n tokens in one forward
pass, and the drafter's time per level, for the adaptive controller (control.py).

The curve differs by machine far more than any fixed default can cover. Measured on a 2-core
x86_64 CPU with the default model (SmolLM2-135M), time for n tokens over time for one:

    n                          2     4     8     16    32    64
    float32 + MKL (pip)        1.14  1.61  2.02  2.47  3.66  6.3   (one token: 37 ms)
    float32 + OpenBLAS         1.04  1.24  1.61  2.35  3.85  7.2   (one token: 67 ms)
    float32, MLX's own BLAS    1.73  3.17  6.00  11.8  23.7  46
    stored 4-bit weights       1.89  3.60  6.93  13.7  27.0  53

(an H100 verifies 64 tokens for ~1.4x one; Apple chips differ by chip and quantization). So the
curve is measured, not assumed:

- `calibrate()` times forwards of n = 1, 2, 4, ... tokens over a 128-token context (each size run
  once untimed first: kernel set-up and JIT compilation are not the curve), ROUNDS times each,
  the sizes interleaved so a stall from another process costs one sample and not a size's
  figure, stopping after a few seconds or once n tokens cost `STOP_RATIO` times one (larger n
  then extrapolate on the last slope, or the slope from one token where steeper: never flat); it times plain
  pipelined decoding steps (what a parked controller costs) and the drafter's levels;
- the result is cached on disk (`cost_model.json` beside the model, else in the user cache),
  keyed by device, model file, weight format and MLX version, so a change of any of them
  measures again (the drafter's levels by the drafter's digest: one put in another's place is
  timed anew); a run that finds the machine much faster than its cached curve (a curve
  measured while another process was busy) marks it, and the next `cost_model` measures again
  (`heal_cached`, once per curve);
- `CostModel.observe_*` refines it online from the real steps' timings: a load factor that
  moves the whole curve (another process, clocks) and a multiplicative correction per
  power-of-two size bucket (context growth moves large sizes more), interpolated between buckets
  and kept monotone; the sizes verified lately average a correction of 1, so the load is what
  they run at and a size not verified lately follows it (`_anchor`),
  and an average of plain steps, which is what a parked controller competes with (generate.py
  times only plain steps in the middle of a pipelined run, the steady state).

Every figure here is in seconds, and every lookup is a few arithmetic operations: no syncs.
"""

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import mlx.core as mx
import numpy as np

from ._platform import device_description, on_cpu
from .files import unwritable_ancestor, update_json
from .registry import cache_dir

FILE = "cost_model.json"
SIZES = (1, 2, 4, 8, 16, 32, 64)  # token counts timed by calibrate()
SHAPE_PENALTY = 2.0  # new shapes costing this many times a repeated one turn shape buckets on
STOP_RATIO = 10.0  # stop timing larger n once n tokens cost this many times one
BUDGET_SECONDS = 3.0  # calibration stops growing n after about this long ...
MIN_SIZE = 4  # ... but times at least 1, 2 and 4 tokens, and 8 unless 4 cost ~4 times one (see calibrate)
CONTEXT = 128  # tokens of context the calibration verifies against: a prompt and the start of a reply
ROUNDS = 3  # timed forwards per size, interleaved
EMA = 0.1  # weight of one new observation in the online corrections
LOAD_EMA = 0.3  # weight of one step in the load factor, which moves the whole curve (CostModel.load)
RECENT = 0.98  # per verification: how a bucket's recent weight decays (CostModel._anchor; about the last 50 count)
PLAIN_CAP = 1.25  # the plain estimate stays within this factor of verifying one token
HEAL_STEPS = 32  # steps of one kind a run observes before it may judge the cached curve (heal_cached)
HEAL_RATIO = 0.75  # ... and finds them under this share of the curve's figures: measured under load
TABLE = 256  # verify(n) is tabulated for n = 1 .. TABLE (the controller drafts at most 64 nodes)
_TABLE_N = np.arange(1, TABLE + 1)
_TABLE_X = np.log2(_TABLE_N.astype(np.float64))
_MIDDLES = np.concatenate([[0.0], np.arange(1, 8) + 0.5])  # the correction buckets' middles in log2(n) (bucket 0: n = 1)


class CostModel:
    """t_verify(n) from measured points, corrected online; t_plain; drafter seconds per level."""

    def __init__(self, sizes: List[int], seconds: List[float], draft_level: Optional[float] = None,
                 source: str = "measured", shape_buckets: bool = False, plain: Optional[float] = None):
        if len(sizes) < 1 or len(sizes) != len(seconds) or sizes[0] != 1:
            raise ValueError("a cost model needs the time of 1 token and matching sizes/seconds")
        self.sizes = np.asarray(sizes, dtype=np.float64)
        if not (np.all(np.isfinite(self.sizes)) and np.all(np.diff(self.sizes) > 0)):
            # (a damaged cache's [1, 1, ...] divided by zero, its NaNs made every size cost NaN)
            raise ValueError("a cost model's sizes must rise: 1, 2, 4, ...")
        self.seconds = np.maximum.accumulate(np.asarray(seconds, dtype=np.float64))  # never cheaper for more
        self.draft_level = draft_level  # drafter seconds per tree level (None: not measured yet)
        self._base_table = self.base(_TABLE_N)  # base(n), n = 1 .. TABLE: fixed, read by every verification
        self._base = self._base_table.tolist()
        self.source = source
        self.shape_buckets = shape_buckets  # new shapes cost a compilation here: pad trees (TreeModel.use_shape_buckets)
        self.correction = np.ones(8)  # per bucket floor(log2 n), 1 .. 128+: the curve's shape here
        # What moves every size at once (another process's load, clocks): every verification moves
        # it, so a burst of load lifts the whole curve and its end brings it back. Kept
        # per bucket only, a burst left verifying 1 token at 4x (250 ms against 62) after the load
        # had gone; nothing verified 1 token again, the curve never rises, so every size looked
        # 250 ms and the controller stayed parked for the rest of an 80-question run.
        self.load = 1.0
        self._slow = 0  # steps in a row 5x slower than the curve
        self._seen = np.zeros(8, dtype=bool)  # buckets with a verification observed
        self._recent = np.zeros(8)  # per bucket, its verifications' count decayed by RECENT per verification
        self.plain = float(plain or self.seconds[0])  # a plain (pipelined) decoding step, refined online
        self.plain_measured = self.plain  # as calibrated (cached with the curve)
        self.measured_at: Optional[str] = None  # when the cached curve was measured (None: now)
        self.plain_seen = 0
        self._plain_total = 0.0  # seconds of the plain steps observed (plain_seen of them)
        self._verified = 0  # verifications that moved the load factor
        self.stale: Optional[str] = None  # why a run found this (cached) curve far slower than the machine: measure again
        self.healed = False  # measured again for that reason (heal_cached marks a curve once)
        self._since_verify: Optional[int] = None  # plain steps since the latest verification (None: none yet)
        # Host seconds a speculative step spends outside its drafting and its verification: deciding
        # it, mapping the accepted path back to the plan, learning from it (observe_overhead).
        self.overhead = 0.0
        self._overheads = 0
        self._refresh()

    def _refresh(self):
        """verify(n) for n = 1 .. TABLE, kept as a table: every decision reads it (a step on a
        GPU or an Apple chip takes a few ms, so a lookup must cost microseconds, not a numpy
        interpolation per call)."""
        self._curve = self._corrected(_TABLE_N, self._base_table)
        self._list = self._curve.tolist()
        self.version = getattr(self, "version", -1) + 1  # what caches of figures derived from the curve key on

    # ---- the curve -------------------------------------------------------------------------
    def base(self, n):
        """Calibrated time for n tokens (a number or an array): interpolated, linear past the last
        point on its slope, or on the slope from one token to the last point where that is
        steeper. A calibration cut short by load had cached 1, 2, 4 tokens at 117, 218, 218 ms:
        on the last slope alone every larger tree cost what 2 tokens did."""
        s, t = self.sizes, self.seconds
        slope = max((t[-1] - t[-2]) / (s[-1] - s[-2]), (t[-1] - t[0]) / (s[-1] - s[0])) if s.size > 1 else t[-1]
        n = np.asarray(n, dtype=np.float64)
        out = np.where(n <= s[-1], np.interp(n, s, t), t[-1] + (n - s[-1]) * slope)
        return float(out) if out.ndim == 0 else out

    @staticmethod
    def _bucket(n):
        return np.minimum(np.log2(np.maximum(n, 1)).astype(int), 7)

    def _corrected(self, n: np.ndarray, base: Optional[np.ndarray] = None) -> np.ndarray:
        """base(n) times the corrections, interpolated in log2(n) between the buckets' middles (a
        bucket never observed takes its nearest observed neighbour's), and never cheaper for
        more tokens. Applied bucket by bucket as steps, neighbouring corrections of 1.3 and 0.96
        made 16 tokens cost less than 15 (measured on the 2-core CPU with OpenBLAS): the
        controller then verified 15-token trees for nodes worth ~0.07 tokens each, and ran at
        0.91x the fixed tree's speed with the same tokens per step."""
        seen = np.flatnonzero(self._seen)
        corr = self.correction
        if seen.size:
            nearest = seen[np.argmin(np.abs(np.arange(corr.size)[:, None] - seen[None, :]), axis=1)]
            corr = corr[nearest]
        x = _TABLE_X if n is _TABLE_N else np.log2(np.maximum(np.asarray(n, dtype=np.float64), 1.0))
        base = self.base(n) if base is None else base  # (base: base(n) known already)
        return np.maximum.accumulate(self.load * base * np.interp(x, _MIDDLES, corr))

    def verify(self, n: int) -> float:
        """Seconds to verify n tokens (n = 1: a plain forward that is not pipelined)."""
        if 1 <= n <= TABLE:
            return self._list[n - 1]
        return float(self.verify_curve(n)[-1])

    def verify_curve(self, n_max: int) -> np.ndarray:
        """verify(n) for n = 1 .. n_max, as an array indexed by n - 1 (a view: do not write)."""
        if n_max <= TABLE:
            return self._curve[:n_max]
        return self._corrected(np.arange(1, n_max + 1))

    def ratio(self, n: int) -> float:
        return self.verify(n) / self.verify(1)

    def speculative(self, n: int) -> float:
        """Seconds of a speculative step verifying n tokens, drafting aside: the verification and
        the host's bookkeeping around it (`overhead`), which a plain step's own timing holds."""
        return self.verify(n) + self.overhead

    def speculative_curve(self, n_max: int) -> np.ndarray:
        """speculative(n) for n = 2 .. n_max (the root and at least one draft), indexed by n - 2."""
        return self.verify_curve(n_max)[1:] + self.overhead

    # ---- online refinement -------------------------------------------------------------------
    def observe_verify(self, n: int, seconds: float):
        b = min(max(int(n), 1).bit_length() - 1, 7)  # _bucket(n), without numpy
        r = seconds / max(self._base[n - 1] if 1 <= n <= TABLE else self.base(n), 1e-9)
        q = r / (self.load * self.correction[b])  # this step against the curve
        self._since_verify = 0
        if not self._move_load(q):
            return
        self._verified += 1
        if 0.2 < q < 5.0:
            # the shape learns slowly while the load moves (a step far off the curve is mostly load)
            weight = EMA * min(1.0, 0.25 / max(abs(q - 1.0), 1e-9))
            self.correction[b] += weight * (r / self.load - self.correction[b])
            self._seen[b] = True
        self._recent *= RECENT
        self._recent[b] += 1.0
        self._anchor()
        self._refresh()
        # The plain estimate is refreshed only by plain steps, so a burst of load (another process)
        # while parked would stay in it through a long stretch of drafting, make verification look
        # cheap and the trees ever larger (measured: plain 243 ms against ~70 real, 32-token trees
        # at 0.7x plain speed for the rest of an MT-Bench run). So each verification caps it at
        # PLAIN_CAP times what one token costs on the corrected curve now: a pipelined plain step
        # never costs much more than verifying one token (on the 2-core CPU 57 against 57-62 ms).
        self.plain = min(self.plain, PLAIN_CAP * self.verify(1))

    def observe_plain(self, seconds: float):
        if self.plain_seen and not 0.2 < seconds / self.plain < 5.0:
            return
        if self._since_verify is not None:
            self._since_verify += 1
            if self._since_verify == 1:
                # The first plain step timed after a verification overlaps the forward queued before
                # it was timed and reads short (it held the estimate 5-30% low on MT-Bench).
                return
        self.plain_seen += 1
        self._plain_total += seconds
        self.plain += max(EMA, 1.0 / self.plain_seen) * (seconds - self.plain)

    def _anchor(self):
        """Keep the sizes verified lately at an average correction of 1, the rest of their
        product in the load factor: the load is then what they run at against the calibration, and
        sizes not verified lately follow it with the shape they last had. The product of load and
        correction is all a verification observes, and both learn from it, with different
        filters (the load takes stalls of 2-5x, the corrections clip every step to +-25%): nothing
        held the split, so the load rose step after step while the corrections verified fell to
        match. Sizes no longer verified inherited the load: in a simulation of 4,000 steps (sizes
        2-20, then 2-4; 3% stalls) 16 tokens came to be modeled at 1,637 ms against 144 true, and
        on the 80 MT-Bench questions every adaptive column ended modeling 16 tokens at 7.8-10.7x
        one against a calibrated 2.1x, which kept its trees small (anchored: 2.2x, and `auto`
        1.38x -> 1.56x). Moved by a bucket's share of the recent weight, a size verified lately
        keeps its figure exactly; a stale one follows the load."""
        w = self._recent
        total = w.sum()
        if total <= 0.0:
            return
        log_c = np.log(np.maximum(self.correction, 1e-9))
        m = float(w @ log_c) / total
        self.correction = np.exp(log_c - m * (w / w.max()))
        self.load *= math.exp(m)

    def _move_load(self, q: float) -> bool:
        """One verification took q times what the curve says: move the load
        (by q clipped to 0.2 .. 5). A step 5x slower is a stall (GC, a page fault) and ignored,
        unless 3 come in a row (load); a fast one is never a stall: ignoring those (as the stall
        filter did) left the curve at 10x for good once a burst of load had gone. False: ignored."""
        if q >= 5.0:
            self._slow += 1
            if self._slow < 3:
                return False
        else:
            self._slow = 0
        self.load *= 1.0 + LOAD_EMA * (min(max(q, 0.2), 5.0) - 1.0)
        return True

    def faster_than_measured(self) -> bool:
        """This run found the machine much faster than the calibration did: over HEAL_STEPS plain
        steps their average, or over HEAL_STEPS verifications the load factor, under HEAL_RATIO
        of the calibrated figures. A real run's context is longer than the calibration's, which
        makes its steps slower, not faster; so this is a curve measured while the machine was
        busy (another process, a test suite beside it)."""
        plain = self.plain_seen >= HEAL_STEPS and self._plain_total / self.plain_seen < HEAL_RATIO * self.plain_measured
        return plain or (self._verified >= HEAL_STEPS and self.load < HEAL_RATIO)

    def cut_short(self) -> bool:
        """A curve whose timing stopped before MIN_SIZE tokens though they cost less than STOP_RATIO
        times one: the budget ran out under load (calibrate times them now, whatever the budget)."""
        return self.sizes[-1] < MIN_SIZE and self.seconds[-1] <= STOP_RATIO * self.seconds[0]

    def step_seconds(self, n: int, measured: float) -> float:
        """What verifying n tokens took, for judging a step: the measured time (FixedCosts: the
        curve's, so that a fixed profile alone decides)."""
        return measured

    def drafting_seconds(self, levels: int, measured: float) -> float:
        """What drafting `levels` levels took, for judging a step: the measured time (FixedCosts:
        the model's)."""
        return measured

    def observe_overhead(self, seconds: float):
        """A speculative step's host seconds outside its drafting and verification (the decision
        that opened it, its bookkeeping after verification: generate.py): a plain step's timing
        includes its own decision, so a step that drafts or copies is charged its part too. Measured
        on the 2-core CPU: 0.7 ms beside the default model's ~55 ms step, but 0.24-0.36 ms beside a
        tiny model's 1.5 ms plain step, as on a fast machine (a small model on a GPU or an Apple
        chip), where leaving it out made drafting and copying look faster than they ran. A reading
        over a plain step's time is clipped to it (a pause of the collector, another process)."""
        seconds = min(max(seconds, 0.0), self.plain)
        self.overhead += (1.0 if self._overheads == 0 else EMA) * (seconds - self.overhead)
        self._overheads += 1

    def observe_draft(self, levels: int, seconds: float):
        if levels < 1:
            return
        per = seconds / levels
        self.draft_level = per if self.draft_level is None else self.draft_level + EMA * (per - self.draft_level)

    def summary(self) -> Dict[str, float]:
        """The figures UIs show: plain step ms and verify(n) / verify(1) at a few sizes."""
        return {"plain_ms": 1000 * self.plain, "verify1_ms": 1000 * self.verify(1),
                **{f"x{n}": self.ratio(n) for n in (4, 16, 64)},
                "draft_level_ms": 1000 * (self.draft_level or 0.0), "overhead_ms": 1000 * self.overhead}

    def to_dict(self) -> Dict:
        return {"sizes": self.sizes.astype(int).tolist(), "seconds": self.seconds.tolist(),
                "plain": self.plain_measured, "draft_level": self.draft_level, "shape_buckets": self.shape_buckets,
                "healed": self.healed, **({"stale": self.stale} if self.stale else {})}


class FixedCosts(CostModel):
    """A cost model that real timings never refine: the controller's decisions are then the
    curve's alone (replay.py's cost profiles, the tests' fake machines)."""

    def observe_verify(self, n: int, seconds: float):
        pass

    def observe_plain(self, seconds: float):
        pass

    def observe_overhead(self, seconds: float):
        pass

    def step_seconds(self, n: int, measured: float) -> float:
        return self.verify(n)

    def drafting_seconds(self, levels: int, measured: float) -> float:
        return levels * (self.draft_level or 0.0)

    def observe_draft(self, levels: int, seconds: float):
        pass


# ---- calibration -------------------------------------------------------------------------------

def _time_forward(model, cache, start: int, n: int, vocab: int) -> float:
    tokens = mx.array((np.arange(n) * 7919 + 11) % vocab, dtype=mx.int32)[None]
    positions = mx.array(start + np.arange(n), dtype=mx.int32)
    mask = mx.array(np.tril(np.ones((n, n), dtype=bool)))
    t = time.perf_counter()
    logits, _ = model(tokens, cache, positions=positions, mask=mask)
    np.array(mx.argmax(logits[0], axis=-1))  # the host reads the choices back, as a step does
    seconds = time.perf_counter() - t
    cache.trim_to(start)
    return seconds


def shape_penalty(model, cache, vocab: int, n: int = 3) -> float:
    """How many times a tree forward at a never-seen (tree size, context length) pair costs one
    repeated at a seen pair: ~1 where kernels do not depend on shapes (CPU), 4-6 where each new
    pair compiles kernels or builds a graph (MLX's CUDA backend). The context grows one token
    between the fresh forwards, as it does between decoding steps."""
    start = cache.offset
    _time_forward(model, cache, start, n, vocab)  # the size's first kernels, untimed
    repeated = min(_time_forward(model, cache, start, n, vocab) for _ in range(2))
    fresh = []
    for i in range(3):
        mx.eval(model.hidden(mx.array([[(start + i) % vocab]], dtype=mx.int32), cache))  # one more token of context
        fresh.append(_time_forward(model, cache, start + i + 1, n, vocab))
    cache.trim_to(start)
    return sorted(fresh)[1] / max(repeated, 1e-9)


def wants_shape_buckets(model, cache, vocab: int) -> bool:
    """Whether new (tree size, context) shapes cost more than SHAPE_PENALTY times a repeated one
    here. A first reading over it is taken again a few tokens of context further on (pairs never
    seen either): a backend that compiles per shape pays at every new pair, while a burst of load
    from another process inflates one reading, hardly two in a row (one did, on the 2-core CPU
    beside two other jobs, and padded every tree there for nothing)."""
    if shape_penalty(model, cache, vocab) <= SHAPE_PENALTY:
        return False
    start = cache.offset
    mx.eval(model.hidden(mx.array(((start + np.arange(8)) % vocab)[None], dtype=mx.int32), cache))
    try:
        return shape_penalty(model, cache, vocab) > SHAPE_PENALTY
    finally:
        cache.trim_to(start)


def time_plain(model, cache, start: int, vocab: int, steps: int = 8) -> float:
    """Seconds per step of plain decoding as mode "ar" runs it (each step's forward queued before
    the previous step's token is read back): what a parked controller costs, and a little less
    than verifying one token (on the 2-core CPU 57 against 62 ms). The median of the steady steps."""
    token = mx.array([[start % vocab]], dtype=mx.int32)
    y = mx.argmax(model(token, cache)[0][0, -1])
    mx.async_eval(y)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        nxt = mx.argmax(model(y.reshape(1, 1), cache)[0][0, -1])
        mx.async_eval(nxt)
        y.item()
        times.append(time.perf_counter() - t)
        y = nxt
    y.item()
    cache.trim_to(start)
    return float(np.median(times[2:]))


def calibrate(model, drafter=None, budget: float = BUDGET_SECONDS,
              progress: Optional[Callable[[str], None]] = None, cached: bool = True) -> CostModel:
    """Time verification of 1, 2, 4, ... 64 tokens, a plain decoding step (and the drafter's
    levels) on this machine. Every size is timed ROUNDS times, the sizes interleaved, and the
    fastest kept: a stall from another process then costs one sample of a size, not its figure
    (a calibration taken beside a burst of load had made 2 tokens cost 1.24x one instead of
    1.1x, and the controller avoided small trees for the whole session)."""
    if progress:
        progress("measuring this machine's verification cost (" + (
            "once per model and device" if cached else
            "every run: there is no folder to cache it in that can be written, set REDRAFTER_CACHE to one"
        ) + ("" if on_cpu() else "; a fresh machine compiles GPU kernels first, which on MLX's CUDA backend can take "
             "minutes") + ")")
    vocab = int(model.args.vocab_size)
    cache = model.make_cache()
    model.hidden(mx.array(np.arange(CONTEXT) % vocab, dtype=mx.int32)[None], cache)
    mx.eval(cache.state)
    buckets = False
    if hasattr(model, "use_shape_buckets"):
        model.use_shape_buckets(False)
        buckets = wants_shape_buckets(model, cache, vocab)
        model.use_shape_buckets(buckets)
    sizes, samples = [], []
    spent = 0.0  # steady-state seconds the timed rounds take: what the budget bounds
    for n in SIZES:
        if samples:
            last, first = min(samples[-1]), min(samples[0])
            # Past the budget, sizes up to 2 x MIN_SIZE are still timed unless MIN_SIZE tokens cost
            # nearly MIN_SIZE times one (verification linear: larger n tell nothing new). A budget
            # spent by a burst of load had stopped at 2 tokens, timed 3.6x one in the burst; the
            # curve on that slope cost 16 tokens 40x one, and every later run on it decoded plainly
            # (drafting could never pay, so nothing was verified to correct it).
            needed = sizes[-1] < MIN_SIZE or (sizes[-1] < 2 * MIN_SIZE and last < 0.8 * sizes[-1] * first)
            if last > STOP_RATIO * first and needed:
                # One sample each so far: a burst of load on it had stopped the curve at 2 tokens,
                # though the fastest of the rounds below cost them ~1x one, and the next load
                # measured it all again as cut short. Judge on the fastest of ROUNDS, as they will.
                for _ in range(ROUNDS - 1):
                    samples[0].append(_time_forward(model, cache, CONTEXT, sizes[0], vocab))
                    samples[-1].append(_time_forward(model, cache, CONTEXT, sizes[-1], vocab))
                last, first = min(samples[-1]), min(samples[0])
            if last > STOP_RATIO * first or (spent + ROUNDS * 2 * last > budget and not needed):
                break  # larger n extrapolate on the last slope
        # The first forward of a new size sets up its kernels, untimed and outside the budget: on
        # MLX's CUDA backend that compiles them (30-100 s for some sizes on a fresh machine, then
        # cached on disk); timed, it made a flat curve look linear and auto never drafted there.
        _time_forward(model, cache, CONTEXT, n, vocab)
        samples.append([_time_forward(model, cache, CONTEXT, n, vocab)])
        sizes.append(n)
        spent += ROUNDS * samples[-1][0]
    for _ in range(ROUNDS - 1):
        for n, times in zip(sizes, samples):
            times.append(_time_forward(model, cache, CONTEXT, n, vocab))
    plain = time_plain(model, cache, CONTEXT, vocab)
    # n tokens in one forward never cost more than n forwards of one (what plain decoding does):
    # a figure above that is load that hit one size's rounds, and would price its trees out.
    seconds = [min(min(t), n * min(samples[0])) for n, t in zip(sizes, samples)]
    costs = CostModel(sizes, seconds, shape_buckets=buckets, plain=plain)
    if drafter is not None:
        costs.draft_level = time_drafter(drafter, model)
    return costs


def time_drafter(drafter, model, width: int = 4, depth: int = 4) -> float:
    """Seconds per level of a tree drafted `width` wide, `depth` deep (the best of three)."""
    from .tree_search import expand

    h = mx.zeros((model.args.hidden_size,), dtype=mx.float32)
    expand(drafter, model, h, 1, width, depth, min_prob=1e-9)  # warm-up
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        expand(drafter, model, h, 1, width, depth, min_prob=1e-9)
        best = min(best, time.perf_counter() - t)
    return best / depth


# ---- the on-disk cache ---------------------------------------------------------------------------

def model_files_digest(path) -> str:
    """A digest of a model's weight files (path, size, modification time): another model, or the
    same folder with other weights, gets another one."""
    path = Path(path)
    try:
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        ident = ";".join(f"{f.resolve()}:{f.stat().st_size}:{int(f.stat().st_mtime)}" for f in files)
    except OSError:
        ident = str(path)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


SAMPLE = 1 << 20  # bytes read from each end of a drafter's weights for its digest


def drafter_digest(folder: Optional[Path]) -> Optional[str]:
    """A digest of the drafter in `folder`: its config.json, and its weights' size and first and
    last MiB (every tensor of a drafter trained or converted anew differs; a few MiB read per load,
    not a 1 GB hash). From the bytes, not the path or the modification times, so a model folder
    moved or copied keeps its tuned shapes (tuning.py) and its drafter's timing. None where it
    cannot be read."""
    if folder is None:
        return None
    h = hashlib.sha256()
    try:
        for f in (Path(folder) / "config.json", Path(folder) / "model.safetensors"):
            size = f.stat().st_size
            h.update(f"{f.name} {size}\n".encode())
            with open(f, "rb") as r:
                h.update(r.read(SAMPLE))
                if size > 2 * SAMPLE:
                    r.seek(size - SAMPLE)
                h.update(r.read())
    except OSError:
        return None
    return h.hexdigest()[:16]


def cpu_name() -> str:
    """The processor's model name ('' where it cannot be read)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_key() -> str:
    """The device as the cache keys it. On a CPU, device_description() names only the
    architecture and the BLAS ('cpu (x86_64, MKL)'): a model folder copied to, or shared with,
    another machine (an NFS home), or a process limited to fewer cores (taskset, a container),
    read the curve another CPU measured. The CPU's model and the cores this process may use
    are part of it there."""
    desc = device_description()
    if not on_cpu():
        return desc
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (macOS has no affinity)
        cores = os.cpu_count() or 0
    return f"{desc} {cpu_name() or '?'}, {cores} cores"


def cache_key(loaded) -> str:
    """Device (on a CPU its model and usable cores), model file (path, size, modification time),
    weight format and MLX version."""
    path = Path(loaded.path)
    if path.is_file() or any(path.glob("*.safetensors")):
        digest = model_files_digest(path)
    else:
        # A model built in memory (path "."): its files' digest was that of no files, the same for
        # every such model, and a 12-token tiny model's curve was read back for one of 5,000 tokens.
        # Its shapes are what its cost depends on: keyed by its configuration (all of it: ModelArgs
        # holds a few of its fields).
        config = getattr(loaded.model, "config", None)
        text = json.dumps(config, sort_keys=True, default=str) if isinstance(config, dict) else repr(loaded.args)
        digest = "config " + hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{machine_key()} | {loaded.weight_format} | mlx {mx.__version__} | {digest}"


def cache_paths(loaded) -> List[Path]:
    """Where the cache is read and written: beside the model (and its tuned shapes), else the
    user cache folder (a read-only model folder, e.g. a shared hub cache)."""
    path = Path(loaded.path)
    folder = path if path.is_dir() else path.parent
    user = cache_dir() / "costs"
    user_file = user / f"{hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]}.json"
    is_model = path.is_file() or (path / "config.json").is_file()  # not, e.g., an in-memory model's "."
    return [folder / FILE, user_file] if is_model else [user_file]


def drafter_key(loaded) -> str:
    """The drafter a figure of seconds per level is for: its digest (drafter_digest), else its path.
    (By path alone, a drafter put in place of another, e.g. in MODEL/drafter, kept the other's figure.)"""
    path = getattr(loaded, "drafter_path", None)
    return drafter_digest(path) or str(path)


def read_cached(loaded) -> Optional[CostModel]:
    key, dkey = cache_key(loaded), drafter_key(loaded)
    # The place write_cached writes first (the first that can be written) is read first: a model folder that can no
    # longer be written kept its old curve in front of the one measured again into the user cache, which was then
    # measured again on every run (a curve marked stale, or cut short) and never read.
    paths = sorted(cache_paths(loaded), key=lambda path: unwritable_ancestor(path) is not None)
    for path in paths:
        try:
            entry = json.loads(path.read_text()).get(key)
            if not entry:
                continue
            times = [float(x) for x in entry["seconds"]] + [float(entry["plain"])]
            if not all(math.isfinite(x) and x > 0 for x in times):
                continue  # a zero or negative time: damaged (it divided by zero in ratio())
            costs = CostModel(entry["sizes"], entry["seconds"], source=f"cached ({path})",
                              shape_buckets=entry.get("shape_buckets") is True,  # (bool("false") is True)
                              plain=float(entry["plain"]))  # an entry from before plain was timed: measure again
            level = (entry.get("draft_level") or {}).get(dkey)  # None: not timed with this drafter
            # a damaged figure ("x", -1) is timed again, not used as the drafter's seconds per level
            ok = isinstance(level, (int, float)) and not isinstance(level, bool) and math.isfinite(level) and level > 0
            costs.draft_level = float(level) if ok else None
            costs.measured_at = entry.get("measured_at")
            costs.stale, costs.healed = entry.get("stale") or None, bool(entry.get("healed"))
            return costs
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # missing or damaged: measure again
    return None


def can_cache(loaded) -> bool:
    """Whether a place `write_cached` tries can be written (checked before measuring, to say so)."""
    return any(unwritable_ancestor(path) is None for path in cache_paths(loaded))


def write_cached(loaded, costs: CostModel, progress: Optional[Callable[[str], None]] = None) -> Optional[Path]:
    """Store the measured curve under this key (other keys kept, at most 8); atomic replace, under
    the folder's lock (files.update_json: a damaged file is kept beside it, and `progress` told).
    Returns the path written, or None when no location is writable."""
    key, dkey = cache_key(loaded), drafter_key(loaded)

    def change(data: Dict) -> Dict:
        old = data.pop(key, None)
        old = old if isinstance(old, dict) else {}  # a damaged entry (a list, a string): replaced
        levels = dict(old["draft_level"]) if isinstance(old.get("draft_level"), dict) else {}
        if costs.draft_level is not None:
            levels[dkey] = costs.draft_level
        data[key] = {**costs.to_dict(), "draft_level": levels,
                     "measured_at": costs.measured_at or time.strftime("%Y-%m-%d %H:%M:%S")}
        return dict(list(data.items())[-8:])

    for path in cache_paths(loaded):
        try:
            return update_json(path, change, note=progress)
        except OSError:
            continue
    return None


def time_missing_drafter(loaded, costs: CostModel) -> bool:
    """Time `loaded`'s drafter into a cached curve that has no figure for it; True if it did.
    The curve is the base model's, whatever drafts for it: a drafter not timed yet (one just
    trained, or the same model used from another checkout) times its own levels alone. Measuring
    the whole curve again replaced it, and a test suite run from a second clone had replaced a
    quiet machine's curve with one taken under load (verifying one token 117 ms against 59)."""
    if loaded.drafter is None or costs.draft_level is not None:
        return False
    costs.draft_level = time_drafter(loaded.drafter, loaded.model)
    return True


def heal_cached(loaded, costs: CostModel) -> bool:
    """After a run on a cached curve: mark the curve to be measured again by the next
    `cost_model` when the run found the machine much faster than it (`faster_than_measured`);
    True if it did. A curve measured under load otherwise stayed until `redrafter-bench --tune`:
    the load factor corrects its scale within a run, but not the shape of sizes a parked
    controller never verifies. Once per curve: one measured again for this reason is not marked
    again, so a machine whose runs always beat its calibration measures once, not every time."""
    if costs.stale or costs.healed or not costs.source.startswith("cached") or not costs.faster_than_measured():
        return False
    plain = costs._plain_total / max(costs.plain_seen, 1)
    costs.stale = (f"a run's plain steps took {1000 * plain:.0f} ms against {1000 * costs.plain_measured:.0f}, "
                   f"verification x{costs.load:.2f} the curve ({time.strftime('%Y-%m-%d %H:%M:%S')})")
    return write_cached(loaded, costs) is not None


def cost_model(loaded, progress: Optional[Callable[[str], None]] = None, refresh: bool = False) -> CostModel:
    """The cached curve for this (device, model, weight format, MLX version), else a calibration
    (a few seconds, reported through `progress`) that is then cached; also a calibration when a
    run marked the cached curve as measured under load (heal_cached), or its timing was cut short
    (CostModel.cut_short; once, as heal_cached's)."""
    cached = None if refresh else read_cached(loaded)
    costs = cached
    short = cached is not None and not cached.stale and not cached.healed and cached.cut_short()
    if cached is None or cached.stale or short:
        if cached is not None and progress:
            why = (f"stopped at {' and '.join(str(int(n)) for n in cached.sizes)} tokens (measured under load)" if short
                   else "was measured while this machine was busier than it is now")
            progress(f"the cached cost curve {why}: measuring again")
        costs = calibrate(loaded.model, loaded.drafter, progress=progress, cached=can_cache(loaded))
        costs.healed = cached is not None
        write_cached(loaded, costs, progress)
    elif time_missing_drafter(loaded, costs):
        write_cached(loaded, costs, progress)
    if hasattr(loaded.model, "use_shape_buckets"):
        loaded.model.use_shape_buckets(costs.shape_buckets)
    return costs
