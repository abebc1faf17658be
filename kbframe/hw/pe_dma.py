"""PE_DMA: one DMA channel (read or write) between HBM and TCM.

A transfer holds the channel only while its data moves (``bytes / bandwidth``); its fixed
setup latency overlaps with other transfers in flight, up to ``max_outstanding`` at once,
as on real DMA engines (DESIGN.md modelling notes). Reads and writes are separate
channels, so they overlap; two reads serialize on the read channel's data phase.

On a shared HBM port in ``arrival`` order (kbframe.hw.hbm) a channel keeps its transfers
in a queue instead of reserving them at once: a transfer takes a slot (one of
``max_outstanding``) when one is free, its setup runs, and only then is its data phase
reserved on the port, in simulated time; a slot frees when its transfer ends. This is the
same channel as the analytic one, with the port served in the order transfers are ready.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..timebase import bytes_to_ps, ns_to_ps
from ..params import duration, param
from .unit import Stage, Unit


@dataclass
class DmaParams:
    """A DMA channel's parameters."""

    bandwidth_gbps: float = param(doc="HBM bandwidth of this channel (= bytes/ns)", unit="GB/s", lo=0, lo_open=True)
    setup_latency_ns: float = duration(doc="fixed latency per transfer; overlaps across transfers in flight")
    max_outstanding: int = param(4, doc="transfers whose setup may be in flight at once", lo=1)


class DmaChannel(Unit):
    """One DMA channel; its parameters: :class:`DmaParams` (kbframe.hw.unit.PeUnit)."""

    Params = DmaParams

    label = "DMA"  # a channel's role (dma_read or dma_write) comes from its config entry
    energy_keys = ("hbm_pj_per_bit", "setup_pj_per_transfer")

    def energy_actions(self, work) -> list:
        """The bits it moved to or from HBM and one setup (descriptor) per transfer."""
        return [("hbm_bits", "hbm_pj_per_bit", 8 * work.bytes),
                ("transfers", "setup_pj_per_transfer", work.count)]

    def tcm_traffic(self, work) -> tuple:
        """A read channel lands its bytes in TCM; a write channel reads them from it."""
        return (0, work.bytes) if "dma_read" in self.roles else (work.bytes, 0)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.setup_ps = ns_to_ps(self.setup_latency_ns)
        self.channels = self.max_outstanding
        self._ends: deque = deque(maxlen=self.max_outstanding)
        self._transfer_cache: dict = {}  # nbytes -> ps (a kernel moves a few tile sizes)
        self.port = None  # the cube's HbmPort when hardware.hbm_mode is shared (set by the engine)
        self._queued: deque = deque()  # arrival order: transfers waiting for a slot
        self._in_flight = 0

    def transfer_ps(self, nbytes: int) -> int:
        """Data-phase time of ``nbytes`` on this channel, integer ps."""
        ps = self._transfer_cache.get(nbytes)
        if ps is None:
            ps = self._transfer_cache[nbytes] = bytes_to_ps(nbytes, self.bandwidth_gbps)
        return ps

    def duration_ps(self, stage: Stage) -> int:
        """Unloaded latency of one transfer: setup + data phase."""
        return self.setup_ps + self.transfer_ps(stage.nbytes)

    def submit(self, stage: Stage) -> None:
        port = self.port
        if port is None or not port.arrival:
            return super().submit(stage)
        self.n_stages += 1
        self._queued.append(stage)
        self._take_slots()

    def _take_slots(self) -> None:
        """Arrival order: start the setup of queued transfers while slots are free."""
        env = self.env
        while self._queued and self._in_flight < self.max_outstanding:
            stage = self._queued.popleft()
            self._in_flight += 1
            stage.t_start = env.now
            env.timeout(self.setup_ps, stage).callbacks.append(self._setup_done)

    def _setup_done(self, ev) -> None:
        """Arrival order: a transfer's setup ended; its data phase queues on the port now."""
        stage, port, now = ev.value, self.port, self.env.now
        data_start = now if now > port.free_ps else port.free_ps
        end = port.free_ps = data_start + port.transfer_ps(stage.nbytes)
        self.busy_ps += end - data_start
        if end > self.free_ps:
            self.free_ps = end
        stage.t_data, stage.t_end = data_start, end
        self.env.timeout(end - now, stage).callbacks.append(self._transfer_done)

    def _transfer_done(self, ev) -> None:
        self._in_flight -= 1
        self._take_slots()
        self._on_done(ev.value)

    def reserve(self, now: int, stage: Stage) -> None:
        ends = self._ends
        slot_free = ends[0] if len(ends) == self.max_outstanding else 0
        start = now if now > slot_free else slot_free
        ready = start + self.setup_ps
        port = self.port
        if port is None:  # partitioned HBM: this channel's own bandwidth
            data_start = ready if ready > self.free_ps else self.free_ps
            end = data_start + self.transfer_ps(stage.nbytes)
        else:  # shared HBM: the cube's one data server (kbframe.hw.hbm)
            data_start = ready if ready > port.free_ps else port.free_ps
            end = port.free_ps = data_start + port.transfer_ps(stage.nbytes)
        self.busy_ps += end - data_start
        self.free_ps = end
        ends.append(end)
        stage.t_start, stage.t_data, stage.t_end = start, data_start, end
