"""Packed-tree verification ("dynamic tree attention", ReDrafter paper section 3.3).

W beams of L tokens share prefixes (all share the root; beam search makes many share more).
`pack` merges them into a trie and lays its unique nodes out as one sequence, parents before
children, with:

- depth positions: a node at depth d sits at position offset + d, like in its own beam;
- an ancestor-only mask: a node sees the cache, its ancestors and itself;
- `unpacker` (W, L): packed index of every beam token, so `packed[unpacker] == beams`.

Beams may be ragged: a negative token ends its row (the context-lookup beam of lookup.py is
often longer or shorter than the drafter's); its unpacker entries there are -1.

The base model runs once over the packed sequence; `accept` walks the trie from the root
with the base model's choice at each node (argmax, or a sample from its distribution)
and follows the child holding that token, for as long as there is one.
"""

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np


@dataclass
class PackedTree:
    tokens: np.ndarray  # (P,) unique tree tokens, parents before children
    depth: np.ndarray  # (P,) depth in the tree (0 = root)
    parent: np.ndarray  # (P,) packed index of the parent, -1 for the root
    mask: np.ndarray  # (P, P) bool, mask[i, j] = j is i or an ancestor of i
    unpacker: np.ndarray  # (W, L) packed index of beams[w, l], -1 past a ragged row's end
    children: List[Dict[int, int]]  # per node: token -> packed index of that child

    @property
    def size(self) -> int:
        return int(self.tokens.size)


def pack(beams: np.ndarray) -> PackedTree:
    """Merge (W, L) beams sharing prefixes into a trie laid out as one sequence (a negative
    token ends its row)."""
    beams = np.asarray(beams)
    if beams.ndim != 2 or beams.size == 0:
        raise ValueError(f"beams must be a non-empty (W, L) array, got shape {beams.shape}")
    if np.any(beams[:, 0] != beams[0, 0]) or beams[0, 0] < 0:
        raise ValueError("all beams must start with the same root token")
    W, L = beams.shape
    tokens, depth, parent = [int(beams[0, 0])], [0], [-1]
    children: List[Dict[int, int]] = [{}]
    unpacker = np.zeros((W, L), dtype=np.int32)
    for w in range(W):
        node = 0
        for d in range(1, L):
            t = int(beams[w, d])
            if t < 0:
                unpacker[w, d:] = -1
                break
            child = children[node].get(t)
            if child is None:
                child = len(tokens)
                tokens.append(t)
                depth.append(d)
                parent.append(node)
                children.append({})
                children[node][t] = child
            unpacker[w, d] = child
            node = child
    P = len(tokens)
    mask = np.zeros((P, P), dtype=bool)
    for i in range(P):  # parents come first, so their rows are complete
        if parent[i] >= 0:
            mask[i] = mask[parent[i]]
        mask[i, i] = True
    return PackedTree(
        tokens=np.array(tokens, dtype=np.int32),
        depth=np.array(depth, dtype=np.int32),
        parent=np.array(parent, dtype=np.int32),
        mask=mask,
        unpacker=unpacker,
        children=children,
    )


def accept(tree: PackedTree, choices: np.ndarray) -> Tuple[List[int], int]:
    """Walk the trie with the base model's choice at each node.

    choices: (P,) the token the base model picks after each node (argmax for greedy decoding,
    an independent draw from its distribution when sampling). Returns (path, next_token):
    path = packed indices from the root down to the deepest node whose token the base
    model chose (the root always), next_token = the base model's choice after that node.

    Every emitted token is the base model's own choice given the true prefix, so greedy
    output equals plain greedy decoding and sampled output follows the base distribution
    exactly; the draft only decides how many of those choices one forward pass confirms.
    """
    path = [0]
    while True:
        node = path[-1]
        child = tree.children[node].get(int(choices[node]))
        if child is None:
            return path, int(choices[node])
        path.append(child)


def beam_of(tree: PackedTree, path: List[int]) -> int:
    """Index of a beam containing the accepted path (the first such beam)."""
    last = path[-1]
    d = int(tree.depth[last])
    hits = np.nonzero(tree.unpacker[:, d] == last)[0]
    return int(hits[0]) if hits.size else 0
