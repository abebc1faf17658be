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

from ..timebase import bytes_to_ps, ns_to_ps
from .params import at_least_one, duration_ns, positive
from .unit import Stage, Unit


class DmaChannel(Unit):
    """One DMA channel.

    Args:
        bandwidth_gbps: HBM bandwidth of this channel, GB/s (= bytes/ns).
        setup_latency_ns: fixed latency per transfer, ns; overlaps across transfers.
        max_outstanding: transfers whose setup may be in flight at once (≥ 1).
    Raises:
        ValueError: a non-positive bandwidth or outstanding count, or negative latency.
    """

    label = "DMA"  # a channel's role (dma_read or dma_write) comes from its config entry
    energy_keys = ("hbm_pj_per_bit", "setup_pj_per_transfer")

    def energy_actions(self, work) -> list:
        """The bits it moved to or from HBM and one setup (descriptor) per transfer."""
        return [("hbm_bits", "hbm_pj_per_bit", 8 * work.bytes),
                ("transfers", "setup_pj_per_transfer", work.count)]

    def tcm_traffic(self, work) -> tuple:
        """A read channel lands its bytes in TCM; a write channel reads them from it."""
        return (0, work.bytes) if "dma_read" in self.roles else (work.bytes, 0)

    def __init__(self, bandwidth_gbps: float, setup_latency_ns: float, max_outstanding: int = 4,
                 description: str = "", roles=None, label=None):
        super().__init__(description, roles, label)
        positive("bandwidth_gbps", bandwidth_gbps)
        duration_ns("setup_latency_ns", setup_latency_ns)
        at_least_one("max_outstanding", max_outstanding)
        self.bandwidth_gbps = float(bandwidth_gbps)
        self.setup_ps = ns_to_ps(setup_latency_ns)
        self.max_outstanding = int(max_outstanding)
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
