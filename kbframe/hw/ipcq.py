"""IPCQ: PE↔PE queues (``tl.send`` / ``tl.recv`` / ``tl.recv_async``; DESIGN.md decision 9).

A send is a stage on the sending PE's :class:`IpcqSend` unit: it occupies the link to its
destination for ``bytes / gbps`` (one message at a time per link, and per sending unit in
FIFO order), and its data arrives ``latency`` later. A receive is a stage on the receiving
PE's :class:`IpcqRecv` unit; it completes when the matching message (FIFO per link) has
arrived, and takes no time of its own. Each link holds at most ``credits`` messages that
were sent and not yet received: a send beyond that waits (and every later send of that
unit behind it) until a receive frees a credit, as a full queue blocks the sender.

Link figures (documented defaults in ``conf/hardware/cube.yaml``): within a cube, one NoC
hop (predecessor: 256 GB/s, 8 ns per router port, 2 ports); between cubes, the die-to-die
connection (128 GB/s, 8 ns per port, 2 ports per crossing) for each cube crossed (XY
distance), plus the NoC legs. Links of different PE pairs do not contend (an approximation).

The :class:`Fabric` (one per engine) holds the links.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..timebase import bytes_to_ps, ns_to_ps
from ..params import duration, param
from .unit import Stage, Unit


class Link:
    """One directed PE→PE link: its figures and the messages on it."""

    __slots__ = ("src", "dst", "latency_ps", "gbps", "credits", "free_ps", "outstanding", "arrivals",
                 "waiting", "sent", "received", "bytes", "busy_ps", "max_outstanding", "sender")

    def __init__(self, src: int, dst: int, latency_ps: int, gbps: float, credits: int, sender):
        self.src, self.dst, self.latency_ps, self.gbps, self.credits = src, dst, latency_ps, gbps, credits
        self.sender = sender
        self.free_ps = 0
        self.outstanding = 0  # sent and not yet received (credits in use)
        self.max_outstanding = 0
        self.arrivals: deque = deque()  # (arrival time, send stage) of messages no receive has taken yet
        self.waiting: deque = deque()  # receive stages waiting for a message
        self.sent = self.received = self.bytes = self.busy_ps = 0

    #: the counters a run adds to (:meth:`restore_counters`)
    COUNTERS = ("sent", "received", "bytes", "busy_ps")

    def restore_counters(self, **counters) -> None:
        """Set :data:`COUNTERS` (a run made, not simulated: kbframe.run.fastforward)."""
        for name, value in counters.items():
            if name not in self.COUNTERS:
                raise ValueError(f"Link has no counter {name!r}")
            setattr(self, name, value)


class Fabric:
    """The links between the PEs of one engine, made on first use.

    Args:
        pes: the engine's PEs (a link takes its figures from the sending PE's IpcqSend).
        pes_per_cube / cubes_x: the topology (PE ``i`` is in cube ``i // pes_per_cube``,
            cubes laid out row by row, ``cubes_x`` per row).
        switch: the cubes are joined by one switch (``hardware.cube_fabric: switch``, an
            NVSwitch): any two cubes are one crossing apart; else a mesh (XY routing).
    """

    def __init__(self, pes, pes_per_cube: int, cubes_x: int, switch: bool = False):
        self.pes = pes
        self.n_pes = len(pes)
        self.pes_per_cube = int(pes_per_cube)
        self.cubes_x = int(cubes_x)
        self.switch = bool(switch)
        self.links: dict = {}

    def cube_hops(self, src: int, dst: int) -> int:
        """Cube crossings between two PEs (XY routing over the cube mesh; 1 through a switch)."""
        if self.switch:
            return int(src // self.pes_per_cube != dst // self.pes_per_cube)
        ys, xs = divmod(src // self.pes_per_cube, self.cubes_x)
        yd, xd = divmod(dst // self.pes_per_cube, self.cubes_x)
        return abs(xs - xd) + abs(ys - yd)

    def figures(self, src: int, dst: int) -> tuple:
        """``(latency_ps, gbps, sending unit)`` of the link ``src → dst``, from the sending PE's
        IpcqSend (module doc), without making the link."""
        sender = self.pes[src].by_role.get("ipcq_send")
        if sender is None:
            from ..errors import ConfigError
            raise ConfigError(f"PE{src} has no unit serving role 'ipcq_send' (a hardware with IPCQ, "
                              f"e.g. hardware=cube)")
        hops = self.cube_hops(src, dst)
        if hops:
            latency_ns = sender.intra_latency_ns + hops * sender.d2d_latency_ns
            gbps = sender.d2d_gbps
        else:
            latency_ns, gbps = sender.intra_latency_ns, sender.intra_gbps
        return ns_to_ps(latency_ns), gbps, sender

    def link(self, src: int, dst: int) -> Link:
        ln = self.links.get((src, dst))
        if ln is None:
            latency_ps, gbps, sender = self.figures(src, dst)
            ln = self.links[(src, dst)] = Link(src, dst, latency_ps, gbps, sender.credits, sender)
        return ln


@dataclass
class IpcqParams:
    """The sending side's parameters (a route's sum of latencies must fit the time base too:
    kbframe.sim.engine.check_time_base)."""

    intra_latency_ns: float = duration(16.0, doc="latency of a message within a cube (NoC)")
    intra_gbps: float = param(256.0, doc="bandwidth of a link within a cube", unit="GB/s", lo=0, lo_open=True)
    d2d_latency_ns: float = duration(16.0, doc="latency added per cube crossed (die-to-die)")
    d2d_gbps: float = param(128.0, doc="bandwidth of a link that crosses cubes", unit="GB/s", lo=0, lo_open=True)
    credits: int = param(4, doc="messages a link holds before the sender blocks (queue depth)", lo=1)


class IpcqSend(Unit):
    """The sending side of a PE's IPCQ; its parameters: :class:`IpcqParams` (kbframe.hw.unit.PeUnit)."""

    Params = IpcqParams

    roles = ("ipcq_send",)
    label = "IPCQ send"
    energy_keys = ("intra_pj_per_bit", "d2d_pj_per_bit")

    def energy_actions(self, work) -> list:
        """The bits it sent: every message crosses its cube's NoC (``intra``) and each cube
        boundary on its XY route (``d2d``, once per cube crossed), as its latency does."""
        fabric, me = self.pe.fabric, self.pe.index
        intra = d2d = 0
        for (src, dst), ln in sorted(fabric.links.items()):
            if src == me:
                intra += 8 * ln.bytes
                d2d += 8 * ln.bytes * fabric.cube_hops(src, dst)
        return [("intra_bits", "intra_pj_per_bit", intra), ("d2d_bits", "d2d_pj_per_bit", d2d)]

    def tcm_traffic(self, work) -> tuple:
        """A message is read from the sender's TCM."""
        return work.bytes, 0

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._blocked: deque = deque()  # sends waiting for a credit, in FIFO order

    def duration_ps(self, stage: Stage) -> int:
        return bytes_to_ps(stage.nbytes, self.pe.fabric.link(self.pe.index, stage.peer).gbps)

    def submit(self, stage: Stage) -> None:
        link = self.pe.fabric.link(self.pe.index, stage.peer)
        if self._blocked or link.outstanding >= link.credits:
            self._blocked.append(stage)
            return
        self._start(stage, link)

    def _start(self, stage: Stage, link: Link) -> None:
        env = self.env
        now = env.now
        start = max(now, self.free_ps, link.free_ps)
        end = start + bytes_to_ps(stage.nbytes, link.gbps)
        self.free_ps = link.free_ps = end
        self.busy_ps += end - start
        self.n_stages += 1
        link.outstanding += 1
        link.max_outstanding = max(link.max_outstanding, link.outstanding)
        link.sent += 1
        link.bytes += stage.nbytes
        link.busy_ps += end - start
        stage.t_start, stage.t_end = start, end
        arrive = end + link.latency_ps
        env.timeout(end - now, stage).callbacks.append(self._fire_cb)  # before the receive's: logged first
        if link.waiting:
            recv = link.waiting.popleft()
            recv.unit.deliver(recv, link, arrive, stage)
        else:
            link.arrivals.append((arrive, stage))

    def credit_freed(self) -> None:
        """A receive took a message: start the sends now allowed, in order."""
        while self._blocked:
            stage = self._blocked[0]
            link = self.pe.fabric.link(self.pe.index, stage.peer)
            if link.outstanding >= link.credits:
                return
            self._blocked.popleft()
            self._start(stage, link)


class IpcqRecv(Unit):
    """The receiving side of a PE's IPCQ: a receive completes when its message arrived."""

    roles = ("ipcq_recv",)
    label = "IPCQ recv"
    energy_keys = ()  # the link's energy is the sender's; a receive writes TCM only

    def tcm_traffic(self, work) -> tuple:
        """A message lands in the receiver's TCM."""
        return 0, work.bytes

    def duration_ps(self, stage: Stage) -> int:
        return 0

    def submit(self, stage: Stage) -> None:
        link = self.pe.fabric.link(stage.peer, self.pe.index)
        if link.arrivals:
            self.deliver(stage, link, *link.arrivals.popleft())
        else:
            link.waiting.append(stage)

    def deliver(self, stage: Stage, link: Link, arrive_ps: int, send: Stage) -> None:
        """Complete receive ``stage`` with the message ``send`` sent, arriving at ``arrive_ps``.
        A receive that waited for its message records that send as what readied it
        (``ready_by = −2 − send.seq``; the op_log's wait record keeps ``send.seq`` and
        kbframe.sim.waits names the wait ``link``)."""
        env = self.env
        t = max(env.now, arrive_ps)
        stage.t_start = stage.t_end = t
        self.n_stages += 1
        link.received += 1
        env.timeout(t - env.now, (stage, link, send if arrive_ps > env.now else None)).callbacks.append(self._taken)

    def _taken(self, ev) -> None:
        stage, link, send = ev.value
        if send is not None:
            stage.ready_by = -2 - send.seq
        link.outstanding -= 1
        link.sender.credit_freed()
        self._on_done(stage)
