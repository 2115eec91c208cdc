"""Per-step and per-run statistics of a generation, for the API, the bench and the chat UI.

A *step* is one base-model forward after prefill: plain decoding emits one token per step,
ReDrafter emits 1 + (accepted draft tokens). `RunStats` aggregates steps into the figures
people compare: tokens/s, tokens/step, acceptance rate, accepted-length histogram, and the
share of time spent drafting vs verifying.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class StepStats:
    emitted: int  # tokens this step added to the output (accepted drafts + the base model's own)
    drafted: int = 0  # draft tokens proposed (W * (L - 1)), 0 for plain decoding
    packed: int = 0  # tokens in the verification pass after merging shared prefixes
    accepted: int = 0  # draft tokens accepted (emitted - 1 unless stopped early)
    # row of the drafts the accepted tokens came from: with W x L beams, a beam (W: the context-lookup beam, which
    # comes after the drafter's rows); with a tree or adaptive drafting, one of its root-to-leaf rows
    beam: int = 0
    depth: int = 0  # draft positions offered: the deepest beam's drafted tokens (L - 1, or a longer lookup)
    # looked_up: output tokens of the accepted path that only the context drafted (graph.context_only): the
    # lookup copy's, or a context graft's (graph drafting; also in graft_accepted), and no drafter beam's; a
    # copy's prefix that a drafter beam shares is the drafter's, as the step had accepted it without the copy.
    # Counted by position: a step cut by an end token or max_tokens counts the tokens it output only.
    looked_up: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    seconds: float = 0.0
    ended: bool = False  # the step also produced the end-of-turn token (not emitted as output)
    parked: bool = False  # the adaptive controller decoded plainly (drafting did not pay)
    aliases: int = 0  # graph drafting (graph.py): kept draft nodes that reused another node's continuation
    grafted: int = 0  # packed nodes grafted (copied under an alias, or from the context)
    graft_accepted: int = 0  # accepted draft tokens that were grafted nodes


@dataclass
class RunStats:
    """The figures of one reply so far: a stream's events all hold this one object, updated in place as
    the reply goes on. Counts are tokens, times seconds; the properties give the rates (tokens_per_second,
    tokens_per_step, acceptance_rate, packed_per_step, parked_share), histogram() the tokens per step, and
    to_dict() all of them for JSON."""

    # what ran: "ar" (plain decoding), "redrafter" (fixed drafting) or "auto" (the adaptive controller, whether
    # asked for as mode "auto" or "redrafter"); mode "auto" given a drafting setting runs "redrafter" or "ar"
    mode: str = "ar"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of those, the ones a PromptCache held (not read: prefill_seconds is the rest's)
    new_tokens: int = 0  # all generated tokens, the one sampled from the prefill included
    step_tokens: int = 0  # tokens emitted by decode steps (new_tokens minus the prefill's)
    end_tokens: int = 0  # end-of-turn tokens decode steps produced (not in the output)
    steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafted_tokens: int = 0
    packed_tokens: int = 0
    accepted_tokens: int = 0
    draft_depth: int = 0  # draft positions offered, summed over steps
    looked_up_tokens: int = 0  # accepted tokens only the context drafted (StepStats.looked_up), summed
    beam_width: int = 0  # the fixed drafting's shape (mode "redrafter"); 0 where none was fixed (ar, adaptive)
    beam_length: int = 0
    tree: int = 0  # node budget of a dynamic draft tree (tree_search.py); 0: W x L beams
    adaptive: bool = False  # the controller chose each step's drafting (control.py)
    parked_steps: int = 0  # steps the controller decoded plainly
    aliases: int = 0  # graph drafting: alias nodes kept, summed over steps
    grafted_tokens: int = 0  # graph drafting: grafted nodes verified
    graft_accepted_tokens: int = 0  # graph drafting: accepted tokens that were grafted nodes
    controller: Dict[str, float] = field(default_factory=dict)  # its cost model's figures, live
    # sampling's seed: the one given, or the fresh one drawn for this reply when none was; passed back as
    # seed=, it gives this reply again (in any mode). None when greedy.
    seed: Optional[int] = None
    # MLX memory in use at its highest since the reply began, in MB: MLX counts one per process, so
    # streams running beside this one (other threads, interleaved generators) count in it too
    peak_memory_mb: float = 0.0
    accepted_lengths: List[int] = field(default_factory=list)  # tokens produced per step (an end token included)

    def add(self, step: StepStats):
        self.steps += 1
        self.new_tokens += step.emitted
        self.step_tokens += step.emitted
        self.end_tokens += int(step.ended)
        self.parked_steps += int(step.parked)
        self.drafted_tokens += step.drafted
        self.packed_tokens += step.packed
        self.accepted_tokens += step.accepted
        self.draft_depth += step.depth
        self.looked_up_tokens += step.looked_up
        self.aliases += step.aliases
        self.grafted_tokens += step.grafted
        self.graft_accepted_tokens += step.graft_accepted
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        self.decode_seconds += step.seconds
        self.accepted_lengths.append(step.emitted + int(step.ended))

    @property
    def tokens_per_step(self) -> float:
        """Tokens each decode step produced, the end-of-turn token it may stop at included, so
        plain decoding is exactly 1.00 (a last step that only finds the end token is 1, not 0)."""
        return (self.step_tokens + self.end_tokens) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens emitted by decode steps over decode time (prefill and its token excluded,
        as mlx-lm reports generation speed)."""
        return self.step_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def packed_per_step(self) -> float:
        """Tokens verified per decode step (1 for a plain step: a parked one, and each of mode
        "ar", which read 0.00 when only parked steps counted)."""
        plain = self.steps if self.mode == "ar" else self.parked_steps
        return (self.packed_tokens + plain) / self.steps if self.steps else 0.0

    @property
    def parked_share(self) -> float:
        return self.parked_steps / self.steps if self.steps else 0.0

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens per draft position offered (L - 1 per step, more when a longer
        context-lookup beam was added), in [0, 1]."""
        tried = self.draft_depth
        return self.accepted_tokens / tried if tried else 0.0

    @property
    def merged_tokens(self) -> int:
        """Draft tokens the prefix merge removed from verification: those drafted (the beams or the
        tree, and the lookup copy) plus each step's root, minus those packed. (W * L per step minus
        packed went negative with a lookup copy, which is packed too, and counted W - 1 copies of
        the root.) 0 where drafting is not fixed, or with graph drafting (its grafts are packed
        without being drafted)."""
        if self.mode != "redrafter" or self.adaptive or self.aliases or self.grafted_tokens:
            return 0
        return self.drafted_tokens + self.steps - self.packed_tokens

    def histogram(self) -> Dict[int, int]:
        return dict(sorted(Counter(self.accepted_lengths).items()))

    def to_dict(self) -> Dict[str, object]:
        return {
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "step_tokens": self.step_tokens,
            "end_tokens": self.end_tokens,
            "steps": self.steps,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "drafted_tokens": self.drafted_tokens,
            "packed_tokens": self.packed_tokens,
            "accepted_tokens": self.accepted_tokens,
            "draft_depth": self.draft_depth,
            "looked_up_tokens": self.looked_up_tokens,
            "aliases": self.aliases,
            "grafted_tokens": self.grafted_tokens,
            "graft_accepted_tokens": self.graft_accepted_tokens,
            "beam_width": self.beam_width,
            "beam_length": self.beam_length,
            "tree": self.tree,
            "adaptive": self.adaptive,
            "parked_steps": self.parked_steps,
            "parked_share": self.parked_share,
            "packed_per_step": self.packed_per_step,
            "controller": dict(self.controller),
            "seed": self.seed,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_rate": self.acceptance_rate,
            "peak_memory_mb": self.peak_memory_mb,
            "accepted_length_histogram": self.histogram(),
        }
