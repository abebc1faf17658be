"""GQA decode of a batch of sequences × KV heads over many PEs, one whole (sequence, KV head)
item per PE at a time (kernel :func:`kbframe.kernels.decode_heads.decode_heads`).

The batch, its stacked HBM tensors (row windows per item), inputs and float64 reference are
:class:`~kbframe.workloads.attention.HeadsBatch`'s. Items ``i = b·H_kv + h`` go to the PEs
by ``bench.mapping``:

* ``blocked``: PE p takes a contiguous run of items, ``⌊p·n/P⌋ .. ⌊(p+1)·n/P⌋`` (n items,
  P = ``hardware.n_pes``): neighbouring heads of one sequence share a PE;
* ``round_robin``: PE p takes items ``p, p + P, p + 2P, ...``.

A PE with no item runs nothing. Sequence lengths may differ (``bench.S_kv`` a list); a
sequence of length 0 gets an output of 0. ``bench.inner`` picks the opt2 or opt3 inner loop.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..params import param
from .attention import HeadsBatch, HeadsConfig
from .base import Workload

MAPPINGS = ("blocked", "round_robin")


@dataclass
class DecodeHeadsConfig(HeadsConfig):
    """The batch, plus how its items map onto the PEs."""

    mapping: str = param("blocked", doc="blocked | round_robin")


class DecodeHeads(HeadsBatch, Workload):
    """All KV heads of a batch of sequences, each item whole on one PE."""

    Config = DecodeHeadsConfig

    def validate(self) -> None:
        self.validate_heads()
        if self.cfg.mapping not in MAPPINGS:
            raise ConfigError(f"bench.mapping must be one of {', '.join(MAPPINGS)}, got '{self.cfg.mapping}'")

    def assignment(self) -> dict[int, list[int]]:
        """``{pe: [item index, ...]}`` for every PE that gets work (``bench.mapping``)."""
        n, P = len(self.items()), self.n_pes
        out: dict[int, list[int]] = {}
        for i in range(n):
            pe = i % P if self.cfg.mapping == "round_robin" else next(p for p in range(P) if i < (p + 1) * n // P)
            out.setdefault(pe, []).append(i)
        return out

    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        items, lengths = self.items(), self.lengths()
        progs = {}
        for pe, idx in self.assignment().items():
            tl = make_tl(pe)
            q, k, v, out = (tl.ref(n) for n in ("q", "k", "v", "out"))
            work = []
            for i in idx:
                b, h = items[i]
                q0, q1 = self.q_rows(b, h)
                k0, k1 = self.kv_rows(b, h)
                kv = (k[k0:k1], v[k0:k1]) if k1 > k0 else (None, None)
                work.append((q[q0:q1], *kv, out[q0:q1], lengths[b]))
            kw = {**self.kernel_kwargs(inputs), "items": work}
            progs[pe] = (lambda tl=tl, kw=kw: kernel(tl, **kw))
        return progs

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        """The keyword arguments of every PE's call; ``items`` (empty here) is each PE's own
        (:meth:`programs`)."""
        c = self.cfg
        return dict(items=[], G=self.G, d=c.d, tile=int(c.tile), scale=self.scale(inputs), inner=c.inner)

    def n_units(self) -> int:
        return sum(self.item_tiles(self.lengths()[b]) for b, _ in self.items())

    def periodic_axis(self) -> tuple[str, int] | None:
        # every sequence of one length: a tile fewer for each item
        c = self.cfg
        return ("S_kv", int(c.tile)) if isinstance(c.S_kv, int) and c.inputs.path is None else None

    def shape(self) -> dict:
        return {**self.heads_shape(), "mapping": self.cfg.mapping, "pes": len(self.assignment()),
                "n_tiles": self.n_units()}
