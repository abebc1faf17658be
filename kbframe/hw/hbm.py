"""A cube's HBM (DESIGN.md glossary: cube). With ``hardware.hbm_mode: partitioned`` (the
predecessor's default) each PE owns its pseudo-channels: its DMA channels move data at their
own bandwidth and PEs never contend. With ``shared``, every DMA channel of the cube's PEs
moves its data through one :class:`HbmPort` at the cube's total bandwidth, so an uneven
mapping shows up as contention.
"""
from __future__ import annotations

from ..timebase import bytes_to_ps


class HbmPort:
    """A cube's HBM shared by its PEs (``hardware.hbm_mode: shared``): one data server at
    the cube's total bandwidth, so transfers of different PEs contend.

    Args:
        gbps: the cube's HBM bandwidth, GB/s.
    """

    def __init__(self, gbps: float):
        self.gbps = float(gbps)
        self.free_ps = 0
        self._cache: dict = {}

    def transfer_ps(self, nbytes: int) -> int:
        ps = self._cache.get(nbytes)
        if ps is None:
            ps = self._cache[nbytes] = bytes_to_ps(nbytes, self.gbps)
        return ps
