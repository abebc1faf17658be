"""Split-K GQA decode (flash-decoding) over many PEs (kernel
:func:`kbframe.kernels.decode_splitk.decode_splitk`).

Each (sequence, KV head) item ``i`` of the batch (:class:`~kbframe.workloads.attention.HeadsBatch`:
the stacked HBM tensors, inputs and float64 reference) is split over ``P = bench.splits``
PEs (null: ``hardware.n_pes // items``), ``i·P .. i·P + P − 1``, by key ranges: an even split (split r of S keys covers
``⌊r·S/P⌋ .. ⌊(r+1)·S/P⌋``, so splits of S < P keys include empty ones) or, with
``bench.chunk = c``, ``r·c .. (r+1)·c`` clipped to S (trailing splits may be empty). Each PE
runs the opt2 or opt3 inner loop (``bench.inner``) over its range; the partials are merged
over IPCQ with the ``lse_merge`` recipe along ``bench.merge`` (``tree``, ``chain`` or
``gather``; :func:`~kbframe.kernels.collectives.merge_plan`), and the item's first PE
stores ``O / l``. Items × splits must fit the topology (``hardware.n_pes``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError
from ..params import param
from ..kernels.collectives import TOPOLOGIES, merge_plan
from .attention import HeadsBatch, HeadsConfig
from .base import Workload


@dataclass
class DecodeSplitkConfig(HeadsConfig):
    """The batch (one KV head of G = 8 by default), split over PEs by key ranges."""

    H_q: int = param(8, lo=1, hi=65536, doc="query heads")
    H_kv: int = param(1, lo=1, hi=65536, doc="KV heads")
    splits: Optional[int] = param(None, doc="PEs per (sequence, KV head); None → hardware.n_pes // items")
    chunk: Optional[int] = param(None, doc="keys per split; None → an even split")
    merge: str = param("tree", doc="tree | chain | gather")


class DecodeSplitk(HeadsBatch, Workload):
    """Every (sequence, KV head) split over ``bench.splits`` PEs, partials merged over IPCQ."""

    Config = DecodeSplitkConfig

    def validate(self) -> None:
        self.validate_heads()
        c = self.cfg
        if c.splits is not None and c.splits < 1:
            raise ConfigError(f"bench.splits must be ≥ 1 (or null: every PE the topology has per item), "
                              f"got {c.splits}")
        if c.splits is not None and c.splits > self.n_pes:
            raise ConfigError(f"bench.splits={c.splits} is more than the {self.n_pes} PE(s) of the topology "
                              f"(hardware.n_pes; one PE per split)")
        if c.merge not in TOPOLOGIES:
            raise ConfigError(f"bench.merge must be one of {', '.join(TOPOLOGIES)}, got '{c.merge}'")
        n, P = len(self.items()), self.splits
        if n * P > self.n_pes:
            raise ConfigError(f"{n} (sequence, KV head) items (bench.H_kv={c.H_kv} × {len(self.lengths())} "
                              f"sequence(s)) × bench.splits={P} need {n * P} PEs, more than the topology's "
                              f"hardware.n_pes={self.n_pes}")
        if c.chunk is not None:
            if c.chunk < 1:
                raise ConfigError(f"bench.chunk must be ≥ 1 (or null: an even split), got {c.chunk}")
            if c.chunk * P < max(self.lengths()):
                raise ConfigError(f"bench.chunk={c.chunk} × bench.splits={P} = {c.chunk * P} keys do "
                                  f"not cover bench.S_kv={max(self.lengths())}")

    @property
    def splits(self) -> int:
        """PEs per item: ``bench.splits``, or every PE the topology has per item."""
        s = self.cfg.splits
        return int(s) if s is not None else max(1, self.n_pes // len(self.items()))

    def ranges(self, S: int) -> list[tuple[int, int]]:
        """Key range ``[r0, r1)`` of each split of a sequence of ``S`` keys."""
        P, c = self.splits, self.cfg.chunk
        if c is None:
            return [(r * S // P, (r + 1) * S // P) for r in range(P)]
        return [(min(S, r * c), min(S, (r + 1) * c)) for r in range(P)]

    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        c = self.cfg
        P = self.splits
        plan = merge_plan(P, c.merge)
        lengths = self.lengths()
        common = self.kernel_kwargs(inputs)
        progs = {}
        for i, (b, h) in enumerate(self.items()):
            pes = [i * P + r for r in range(P)]
            q0, q1 = self.q_rows(b, h)
            k0, _ = self.kv_rows(b, h)
            for r, (s0, s1) in enumerate(self.ranges(lengths[b])):
                tl = make_tl(pes[r])
                q, k, v, out = (tl.ref(n) for n in ("q", "k", "v", "out"))
                kv = (k[k0 + s0:k0 + s1], v[k0 + s0:k0 + s1]) if s1 > s0 else (None, None)
                kw = {**common, "q": q[q0:q1], "k": kv[0], "v": kv[1], "out": out[q0:q1] if r == 0 else None,
                      "S": s1 - s0, "steps": plan[r], "pes": pes, "empty": lengths[b] == 0}
                progs[pes[r]] = (lambda tl=tl, kw=kw: kernel(tl, **kw))
        return progs

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        """The keyword arguments of every PE's call; the split's own (``q``, ``k``, ``v``,
        ``out``, ``S``, ``steps``, ``pes``, ``empty``) are neutral here and set per PE by
        :meth:`programs`."""
        c = self.cfg
        return dict(q=None, k=None, v=None, out=None, S=0, steps=[], pes=[], G=self.G, d=c.d, tile=int(c.tile),
                    scale=self.scale(inputs), inner=c.inner, empty=False)

    def periodic_axis(self) -> tuple[str, int] | None:
        # even splits: S_kv − splits·tile takes one tile from every split (⌊r·S/P⌋ moves by r·tile)
        c = self.cfg
        if not isinstance(c.S_kv, int) or c.inputs.path is not None or c.chunk is not None:
            return None
        return "S_kv", int(c.tile) * self.splits

    def n_units(self) -> int:
        lengths = self.lengths()
        return sum(self.item_tiles(s1 - s0) for b, _ in self.items() for s0, s1 in self.ranges(lengths[b]))

    def shape(self) -> dict:
        c = self.cfg
        return {**self.heads_shape(), "splits": self.splits, "chunk": c.chunk, "merge": c.merge,
                "pes": len(self.items()) * self.splits, "n_tiles": self.n_units()}
