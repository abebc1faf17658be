"""A cube's HBM (DESIGN.md glossary: cube). With ``hardware.hbm_mode: partitioned`` (the
predecessor's default) each PE owns its pseudo-channels: its DMA channels move data at their
own bandwidth and PEs never contend. With ``shared``, every DMA channel of the cube's PEs
moves its data through one :class:`HbmPort` at the cube's total bandwidth, so an uneven
mapping shows up as contention.

``hardware.hbm_arbitration`` says in which order the shared port serves the transfers:
``submission`` (the default) in the order the channels reserve them, when their stages are
submitted (exact when transfers are submitted about when they are ready, as on a few PEs);
``arrival`` in the order their setup latencies end, in simulated time (a channel then takes
a transfer's data phase only once it is ready, :class:`~kbframe.hw.pe_dma.DmaChannel`): with
many PEs each submitting a long stream of transfers at once, a PE's far-future reservations
no longer hold back the transfers of the PEs after it (the GPU presets' SMs).
"""
from __future__ import annotations

from ..timebase import bytes_to_ps


class HbmPort:
    """A cube's HBM shared by its PEs (``hardware.hbm_mode: shared``): one data server at
    the cube's total bandwidth, so transfers of different PEs contend.

    Args:
        gbps: the cube's HBM bandwidth, GB/s.
        arrival: serve transfers in the order they become ready (module doc); False: in the
            order they are reserved.
    """

    def __init__(self, gbps: float, arrival: bool = False):
        self.gbps = float(gbps)
        self.arrival = bool(arrival)
        self.free_ps = 0
        self._cache: dict = {}

    def transfer_ps(self, nbytes: int) -> int:
        ps = self._cache.get(nbytes)
        if ps is None:
            ps = self._cache[nbytes] = bytes_to_ps(nbytes, self.gbps)
        return ps
