"""The workload protocol: what a bench runs (DESIGN.md decision 7).

A bench config names a workload class (``_target_``, a :class:`Workload` subclass defined
in a kbframe module) and carries that class's typed config (:attr:`Workload.Config`, a
dataclass extending :class:`BenchConfig`). The workload, not the run shell, owns:

* its HBM tensors (:meth:`Workload.tensors`: name → shape, in placement order; the names in
  :attr:`Workload.outputs` are written by the kernel, the others are inputs);
* its inputs: generated from ``bench.seed`` (:meth:`Workload.generate`) or read from an
  inputs file (:meth:`Workload.accept_file`, which sees only the arrays the workload knows:
  the run shell refuses any other array by name);
* the kernel's keyword arguments and how its work maps onto PEs (:meth:`Workload.programs`);
* its float64 reference (:meth:`Workload.reference`), compared with the outputs;
* its unit of progress (:attr:`Workload.unit`, :meth:`Workload.n_units`) for the progress bar
  and per-unit metrics, and the shape recorded in ``metrics.json`` (:meth:`Workload.shape`).

Nothing outside a workload module and its kernels names a workload's tensors or shape keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from omegaconf import MISSING, open_dict

from ..params import Choice, param


class Dtype(Choice):
    """A float format: ``bench.dtype`` (timing: bytes moved, TCM footprint, the GEMM's MAC
    energy) and ``bench.data_dtype`` (the numbers in data mode; numpy has no bfloat16)."""

    float16 = "float16"
    float32 = "float32"
    float64 = "float64"
    bfloat16 = "bfloat16"


#: the dtypes an error message names (docs/errors.md's text; bfloat16 is accepted as a timing dtype)
_NAMED = ("float16", "float32", "float64")


@dataclass
class InputsConfig:
    """Where inputs come from: ``path`` to an .npz with the workload's input arrays, else
    generated from ``bench.seed``."""

    path: Optional[str] = param(None, doc="an .npz with the workload's input arrays (null: generated from "
                                          "bench.seed)")


@dataclass
class BenchConfig:
    """Keys every bench has; a workload's ``Config`` adds its own (shape keys, kernel knobs)."""

    _target_: str = MISSING  # the workload class (a kbframe.workloads class)
    name: str = MISSING
    kernel: str = param(MISSING, doc="dotted path of a kernel function in kbframe.kernels")
    dtype: Dtype = param(Dtype.float16, choices=Dtype, listed=_NAMED, doc="timing dtype: bytes moved and TCM footprint")
    data: bool = param(True, doc="data mode: compute real numbers and check them against a float64 reference")
    data_dtype: Dtype = param(Dtype.float32, choices=Dtype, listed=_NAMED, doc="storage dtype of the numbers in data "
                                                                          "mode (not bfloat16)")
    seed: int = param(0, lo=0, doc="seed of the generated inputs")
    pe: int = param(0, doc="the PE the kernel runs on (single-PE workloads; < hardware.n_pes)")
    inputs: InputsConfig = field(default_factory=InputsConfig)


class Workload:
    """Base class of workloads. Subclasses set :attr:`Config`, :attr:`unit`, :attr:`outputs`
    and implement the methods below.

    Args:
        cfg: the ``bench`` config node (already checked against :attr:`Config`).
        n_pes: PEs the topology has (``hardware.n_pes``): the PE indices
            :meth:`programs` may use are ``0 .. n_pes - 1``.
        hardware: the ``hardware`` config node (None: a workload that reads no more of the
            topology than ``n_pes``), for workloads whose checks or mapping depend on it
            (a cube's PEs, a unit's tile, the TCM size).
    """

    #: the typed config (a dataclass extending BenchConfig)
    Config = BenchConfig
    #: unit of progress, singular ("KV tile", "output block")
    unit = "tile"
    #: names of the HBM tensors the kernel writes
    outputs: tuple = ()
    #: bench keys an inputs file makes meaningless (named in the summary as unused)
    generated_only_keys: tuple = ("seed",)
    #: optional arrays an inputs file may hold besides the input tensors (a 0-d scale, a
    #: batch's sequence lengths), read by :meth:`shape_from_file` / :meth:`accept_file`
    file_scalars: tuple = ()
    #: fast-forward's short copies (kbframe.run.fastforward): the steps of the periodic axis
    #: the first keeps, and the share of the run's steps the copies may simulate; None:
    #: fast-forward's defaults (made for KV tiles: thousands of short steps)
    ff_min_steps: int | None = None
    ff_budget: float | None = None
    #: candidate periods, in steps of the periodic axis (None: fast-forward's, 1 to 8)
    ff_periods: tuple | None = None
    #: whether the output tiles of its weight GEMMs (a GEMV streaming its weights) repeat
    #: inside each step of the periodic axis: in one simulation they may be left out too,
    #: as a nested axis's (kbframe.sim.steady.WEIGHT_TILES)
    ff_weight_tiles: bool = False
    #: steps simulated after the period checked past a jump in one simulation
    #: (kbframe.sim.steady.Axis)
    ff_after: int = 2

    def __init__(self, cfg, n_pes: int = 1, hardware=None):
        self.cfg = cfg
        self.n_pes = int(n_pes)
        self.hardware = hardware

    # ---- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError naming ``bench.<key>`` for what the :attr:`Config`'s declarations
        (kbframe.params: ranges, choices, checked before) cannot say: keys that must agree
        with each other or with the topology."""

    # ---- tensors and inputs -------------------------------------------------------------
    def tensors(self) -> dict:
        """HBM tensors, name → shape, in placement order (inputs and outputs)."""
        raise NotImplementedError

    def input_names(self) -> tuple:
        """The input tensors (every tensor that is not an output)."""
        return tuple(n for n in self.tensors() if n not in self.outputs)

    def generate(self, rng: np.random.Generator) -> dict:
        """Generated inputs, name → array (the numbers the kernel gets)."""
        raise NotImplementedError

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        """The shape keys an inputs file implies, ``{key: value}`` (checked against keys the
        user set explicitly; else written into the config). Raises InputsError on shapes
        that contradict each other."""
        return {}

    def accept_file(self, arrays: dict, path: str) -> dict:
        """Inputs from a file's arrays (only names in :meth:`input_names` and
        :attr:`file_scalars`), as the kernel gets them; called after :meth:`shape_from_file`
        has been applied to the config. Default: float64 copies of the tensors."""
        return {n: np.asarray(arrays[n], dtype=np.float64) for n in self.input_names()}

    def host_bytes(self) -> int:
        """Host memory the inputs, outputs and reference need, bytes (a pre-flight check)."""
        n = sum(math.prod(s) for s in self.tensors().values())
        return 3 * 8 * n

    def check_inputs(self, data_dtype: str, inputs: dict) -> None:
        """Extra range checks of the inputs (e.g. scores within the accumulator)."""

    # ---- the run --------------------------------------------------------------------------
    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        """``{pe_index: program}``: the kernel bound to each PE's tl context (``make_tl(pe)``).
        Default: :meth:`kernel_kwargs` on PE ``bench.pe``."""
        pe = int(self.cfg.pe)
        tl = make_tl(pe)
        kw = self.kernel_kwargs(inputs)
        return {pe: lambda: kernel(tl, **kw)}

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        """Keyword arguments of the kernel call."""
        raise NotImplementedError

    def n_units(self) -> int:
        """Units of progress in the run (the per-unit metrics' normaliser)."""
        raise NotImplementedError

    def periodic_axis(self) -> tuple[str, int] | None:
        """``(bench key, step)`` when the work repeats along that key: taking ``k·step`` off
        it takes ``k`` identical steps out of the middle of the run (decode: ``("S_kv",
        tile)``); None (the default) when it does not. Fast-forward (kbframe.run.fastforward)
        uses it, and verifies the repetition before relying on it."""
        return None

    def nested_axes(self) -> tuple:
        """Bench keys of loops nested in each step of :meth:`periodic_axis` whose
        iterations repeat too (a decoder layer's KV tiles): in one simulation they may leave
        out a steady stretch as well (kbframe.sim.steady, with fast-forward's default
        periods and warm-up), put back before the steps they are nested in. () by default."""
        return ()

    def with_axis(self, steps: int, bench=None) -> "Workload":
        """This workload, validated, with :meth:`periodic_axis` at ``steps`` whole steps (and
        the same remainder): the short copies of fast-forward and the record estimate of
        the pre-flight checks. ``bench``: a copy of ``self.cfg`` to set it in (reused by
        many copies); a fresh copy by default."""
        key, step = self.periodic_axis()
        w = self.with_key(key, steps * step + int(self.cfg[key]) % step, bench)
        w.validate()
        return w

    def with_key(self, key: str, value, bench=None) -> "Workload":
        """This workload with bench ``key`` set to ``value``, not yet validated. ``bench``: a
        copy of ``self.cfg`` to set it in (reused by many copies); a fresh copy by default."""
        bench = self.cfg.copy() if bench is None else bench
        with open_dict(bench):
            bench[key] = value
        return type(self)(bench, n_pes=self.n_pes, hardware=self.hardware)

    def progress_stream(self) -> tuple[str, int]:
        """``(tensor, rows per unit)``: the progress bar follows the furthest row of this
        HBM tensor a command names."""
        raise NotImplementedError

    def shape(self) -> dict:
        """``metrics.json`` ``shape``."""
        raise NotImplementedError

    def shape_text(self) -> str:
        """The shape as messages and the summary name it, ``key=value`` (e.g. ``G=8 d=128
        S_kv=4096 tile=64``): counts (``n_*``) and values not set (no model preset) left out."""
        return " ".join(f"{k}={v}" for k, v in self.shape().items() if not k.startswith("n_") and v is not None)

    def describe(self) -> str:
        """The summary's shape line, e.g. ``G=8 d=128 S_kv=4096 tile=64 (64 KV tiles)``."""
        n = self.n_units()
        return f"{self.shape_text()} ({n} {self.unit}{'s' if n != 1 else ''})"

    def tokens(self) -> int | None:
        """Tokens one run makes (a model's decode step: one per sequence), for
        ``metrics.json`` ``step`` (tokens/s); None (the default): not a model step."""
        return None

    def model_layers(self) -> int | None:
        """The layer count of the model a step belongs to, when a run simulates fewer of them
        (``metrics.json`` ``step.model``); None (the default): the run is the whole step."""
        return None

    def whole_model(self) -> "Workload | None":
        """This workload with all of its model's layers (:meth:`model_layers`), validated:
        what a run of the whole step would be (None: the run is the whole step).

        Raises:
            ConfigError: the whole step would be refused (its weights and KV cache over a
                cube's HBM, ...), as a run of it would be.
        """
        return None

    def extra_metrics(self, inputs: dict | None) -> dict:
        """Workload-specific top-level ``metrics.json`` entries."""
        return {}

    # ---- numbers ---------------------------------------------------------------------
    def reference(self, inputs: dict) -> dict:
        """float64 reference, output name → array (the same shape the kernel writes)."""
        raise NotImplementedError

    def read_outputs(self, read) -> dict:
        """The outputs after the run, name → array: ``read(tensor)`` gives an HBM tensor's
        numbers. Default: each name in :attr:`outputs` is an HBM tensor of that name."""
        return {o: read(o) for o in self.outputs}

    def reference_name(self, output: str) -> str:
        """Name of an output's reference in ``tensors.npz``."""
        return "ref" if len(self.outputs) == 1 else f"ref_{output}"

    def saved_scalars(self, inputs: dict) -> dict:
        """0-d arrays saved in ``tensors.npz`` beside the tensors (e.g. the softmax scale)."""
        return {}
