"""The kernel ↔ PE_CPU protocol: what a kernel asks of the PE it runs on, and the one
driver that runs a kernel and hands each request over.

A kernel is a plain Python function (no ``yield``, Triton-like); it runs in a greenlet.
Each tl call that needs PE_CPU switches out with one request:

* :class:`Dispatch` — issue a command (``CompositeCmd`` / ``PrimitiveCmd``; PE↔PE sends
  and receives are commands too); PE_CPU pays its dispatch cost and hands it on;
* :class:`Wait` — block until a :class:`~kbframe.ir.handles.Completion` fires (``tl.wait``,
  or a value the kernel's Python control flow reads).

:func:`requests` is the only driver: PE_CPU (simulated time), the pre-flight dry run
(no time) and the tests iterate over it.
"""
from __future__ import annotations

from greenlet import getcurrent, greenlet


class Dispatch:
    """Request: dispatch ``cmd`` (a command of :mod:`kbframe.ir.commands`)."""

    __slots__ = ("cmd",)

    def __init__(self, cmd):
        self.cmd = cmd


class Wait:
    """Request: block until ``completion`` (a :class:`~kbframe.ir.handles.Completion`) fires."""

    __slots__ = ("completion",)

    def __init__(self, completion):
        self.completion = completion


def request(req) -> None:
    """Called by the tl layer inside a kernel: hand ``req`` to the driver and wait until
    the driver asks for the next request."""
    getcurrent().parent.switch(req)


def requests(program):
    """Run ``program()`` (a kernel bound to its tl context) and yield each request it makes
    (:class:`Dispatch` or :class:`Wait`). The kernel resumes when the consumer asks for the
    next request, so a consumer that blocks (PE_CPU in simulated time) blocks the kernel.

    Raises:
        Whatever the kernel raises (e.g. ValidationError at emit).
    """
    glet = greenlet(program)
    req = glet.switch()
    while not glet.dead:
        yield req
        req = glet.switch()
