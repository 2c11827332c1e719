"""Array backends: the few primitives the metric formulas need, for numpy (CPU) and torch (GPU).

The formulas in ``rcdiag.metrics`` are written once against this interface. Elementwise maths runs in the
arrays' own dtype (float32, as in verl) and every reduction accumulates in float64 and returns a Python
number. Ragged data is reduced per sequence with segment reductions over the flat token array: numpy's
``reduceat`` on CPU (0.2-0.4 ns/token, see docs/performance.md) and ``torch.segment_reduce`` on GPU.

Segments may be empty (a row with no valid token): reductions are taken over the non-empty segments only and
scattered back, so an empty row gets 0 for sums and the given fill value for max/min.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from rcdiag.core.bins import bin_table
from rcdiag.core.formulas import Array

if TYPE_CHECKING:
    from rcdiag.metrics.token_passes import TokenPasses


class Segments(ABC):
    """Row structure of one block: ``lengths[i]`` consecutive tokens belong to row ``i``."""

    n_rows: int
    n_tokens: int

    @abstractmethod
    def sum(self, x: Array) -> Array:
        """Per-row float64 sums (0 for empty rows)."""

    @abstractmethod
    def max(self, x: Array, empty: float) -> Array:
        """Per-row maxima in ``x``'s dtype (``empty`` for empty rows)."""

    @abstractmethod
    def min(self, x: Array, empty: float) -> Array:
        """Per-row minima in ``x``'s dtype (``empty`` for empty rows)."""

    def count(self, cond: Array) -> Array:
        """Per-row number of true entries, as float64."""
        return self.sum(cond)


class Backend(ABC):
    """Elementwise functions plus reductions to Python scalars, and the per-token passes that run on them."""

    name: str
    compiled: bool = True
    """Whether passes over host arrays (the screen, ``--explain``'s) run the numba kernels; ``False`` only on a small
    dump's numpy path (``NumpyBackend(compiled=False)``), which never imports numba."""

    @property
    @abstractmethod
    def passes(self) -> TokenPasses:
        """The per-token passes a ``Block`` on this backend takes (``rcdiag.metrics.token_passes``): the one place the
        compiled kernels or the array path are chosen."""

    @abstractmethod
    def asarray(self, values: np.ndarray) -> Array:
        """Move a host numpy array to this backend (no copy on CPU)."""

    @abstractmethod
    def to_numpy(self, x: Array) -> np.ndarray:
        """Bring an array back to host memory (the sweep bins token statistics on the host)."""

    @abstractmethod
    def segments(self, lengths: np.ndarray) -> Segments:
        """Segment structure for per-row reductions (``lengths`` is int64 on the host)."""

    # elementwise -------------------------------------------------------------------------------------------
    @abstractmethod
    def exp(self, x: Array) -> Array: ...

    @abstractmethod
    def expm1(self, x: Array) -> Array:
        """``exp(x) - 1`` without the cancellation near 0 (in ``x``'s dtype)."""

    @abstractmethod
    def to_float32(self, x: Array) -> Array: ...

    @abstractmethod
    def to_float64(self, x: Array) -> Array: ...

    @abstractmethod
    def abs(self, x: Array) -> Array: ...

    @abstractmethod
    def clip(self, x: Array, lo: float | None, hi: float | None) -> Array: ...

    @abstractmethod
    def where(self, cond: Array, a: Array | float, b: Array | float) -> Array: ...

    # reductions to Python scalars ----------------------------------------------------------------------------
    @abstractmethod
    def sum(self, x: Array) -> float:
        """Sum accumulated in float64."""

    @abstractmethod
    def count(self, cond: Array) -> int:
        """Number of true entries."""

    @abstractmethod
    def max(self, x: Array) -> float:
        """Maximum (NaN-propagating, like torch); ``-inf`` for an empty array."""

    @abstractmethod
    def min(self, x: Array) -> float:
        """Minimum (NaN-propagating, like torch); ``+inf`` for an empty array."""

    def moments(self, x: Array, weights: Array | None = None) -> tuple[float, float, float]:
        """``(n, mean, M2)`` of ``x`` (optionally weighted), centred on this block's own mean, in float64."""
        if weights is None:
            n = float(self.numel(x))
            if n == 0:
                return 0.0, 0.0, 0.0
            mean = self.sum(x) / n
            d = self.minus64(x, mean)
            return n, mean, self.dot(d, d)
        n = self.sum(weights)
        if n == 0:
            return 0.0, 0.0, 0.0
        mean = self.dot(weights, x) / n
        d = self.minus64(x, mean)
        return n, mean, self.dot(weights * d, d)

    def comoments(self, x: Array, y: Array) -> tuple[float, float, float, float, float, float]:
        """``(n, mean_x, mean_y, M2_x, M2_y, C_xy)`` of value pairs, centred on this block's own means, in float64
        (``rcdiag.metrics.base.CoMoments``)."""
        n = float(self.numel(x))
        if n == 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        mean_x, mean_y = self.sum(x) / n, self.sum(y) / n
        dx, dy = self.minus64(x, mean_x), self.minus64(y, mean_y)
        return n, mean_x, mean_y, self.dot(dx, dx), self.dot(dy, dy), self.dot(dx, dy)

    @abstractmethod
    def numel(self, x: Array) -> int:
        """Number of elements."""

    @abstractmethod
    def minus64(self, x: Array, value: float) -> Array:
        """``x - value`` computed in float64."""

    @abstractmethod
    def dot(self, a: Array, b: Array) -> float:
        """``sum(a * b)`` with the products taken and summed in float64 (a square is then exact)."""

    @abstractmethod
    def bin_counts(self, x: Array, edges: np.ndarray) -> np.ndarray:
        """int64 counts of ``x`` in the ``len(edges) + 1`` bins ``[edges[i-1], edges[i])`` (the outer two open);
        NaN is in no bin."""

    # scatters over a flat index (the sweep's array pass, ``rcdiag.sweep.scan_arrays``) --------------------------
    @abstractmethod
    def to_int64(self, x: Array) -> Array: ...

    @abstractmethod
    def int32_bits(self, x: Array) -> Array:
        """A float32 array's bits as int32 (a view)."""

    @abstractmethod
    def repeat(self, values: Array, counts: Array) -> Array:
        """Each value repeated its count's times, in order."""

    @abstractmethod
    def searchsorted(self, edges: Array, x: Array, right: bool) -> Array:
        """Each value's insertion index in the sorted ``edges`` (``right``: after equal edges)."""

    @abstractmethod
    def bincount(self, index: Array, size: int) -> Array:
        """int64 occurrences of each index in ``[0, size)``."""

    @abstractmethod
    def scatter_add(self, index: Array, weights: Array, size: int) -> Array:
        """float64 sums of ``weights`` by index in ``[0, size)`` (numpy adds in index order; a GPU in any)."""

    @abstractmethod
    def scatter_extreme(self, index: Array, values: Array, size: int, largest: bool, fill: float) -> Array:
        """float64 maxima (``largest``) or minima of ``values`` by index, ``fill`` where no value falls."""


# ------------------------------------------------------------------------------------------------------ numpy


class _NumpySegments(Segments):
    def __init__(self, lengths: np.ndarray) -> None:
        self.n_rows = int(lengths.shape[0])
        self.n_tokens = int(lengths.sum())
        self.nonempty = lengths > 0
        self.all_nonempty = bool(self.nonempty.all())
        starts = np.zeros(self.n_rows, dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self.starts = starts if self.all_nonempty else starts[self.nonempty]
        self.lengths = lengths

    def _scatter(self, reduced: np.ndarray, fill: float) -> np.ndarray:
        if self.all_nonempty:
            return reduced
        out = np.full(self.n_rows, fill, dtype=reduced.dtype)
        out[self.nonempty] = reduced
        return out

    def sum(self, x: np.ndarray) -> np.ndarray:
        if self.n_tokens == 0:
            return np.zeros(self.n_rows, dtype=np.float64)
        return self._scatter(np.add.reduceat(x, self.starts, dtype=np.float64), 0.0)

    def count(self, cond: np.ndarray) -> np.ndarray:
        # Rejections are usually rare: the rows of the true entries, counted, beat a reduceat over every token.
        # Dense conditions (above about 3% of tokens, measured) take the reduceat, summed as integers: exact, and
        # a third of the cost of casting every token to float64.
        if np.count_nonzero(cond) * 32 > cond.size:
            return self._scatter(np.add.reduceat(cond, self.starts, dtype=np.int64), 0).astype(np.float64)
        hits = np.flatnonzero(cond)
        rows = np.searchsorted(np.cumsum(self.lengths), hits, side="right")
        return np.bincount(rows, minlength=self.n_rows).astype(np.float64)

    def max(self, x: np.ndarray, empty: float) -> np.ndarray:
        if self.n_tokens == 0:
            return np.full(self.n_rows, empty, dtype=x.dtype)
        return self._scatter(np.maximum.reduceat(x, self.starts), empty)

    def min(self, x: np.ndarray, empty: float) -> np.ndarray:
        if self.n_tokens == 0:
            return np.full(self.n_rows, empty, dtype=x.dtype)
        return self._scatter(np.minimum.reduceat(x, self.starts), empty)


class NumpyBackend(Backend):
    """CPU backend; the default, and the fast path on CPU."""

    name = "cpu"

    def __init__(self, compiled: bool = True) -> None:
        self.compiled = compiled
        """The numba kernels (the default); ``False``: the array passes and the numpy forms of the other kernels,
        which never import numba (a small dump's run: ``rcdiag.kernels.small``)."""

    @cached_property
    def passes(self) -> TokenPasses:
        """The numba kernels over the raw block, or the array passes on numpy (``compiled=False``)."""
        from rcdiag.metrics.token_passes import CompiledPasses, NumpyPasses

        return CompiledPasses() if self.compiled else NumpyPasses()

    def asarray(self, values: np.ndarray) -> np.ndarray:
        return values

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def segments(self, lengths: np.ndarray) -> Segments:
        return _NumpySegments(lengths)

    def exp(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.exp(x)

    def expm1(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.expm1(x)

    def to_float32(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, as verl's float32 arithmetic gives
            return x.astype(np.float32, copy=False)

    def to_float64(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64, copy=False)

    def abs(self, x: np.ndarray) -> np.ndarray:
        return np.abs(x)

    def clip(self, x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
        # np.clip keeps NaN, like torch.clamp.
        return np.clip(x, lo, hi)

    def where(self, cond: np.ndarray, a: Any, b: Any) -> np.ndarray:
        return np.where(cond, a, b)

    def sum(self, x: np.ndarray) -> float:
        return float(np.add.reduce(x, dtype=np.float64)) if x.size else 0.0

    def moments(self, x: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, float, float]:
        if weights is not None or x.dtype != np.float32 or not x.size:
            return super().moments(x, weights)
        # float32 values: cast once and centre in place (summing float32 with dtype=float64 casts every value
        # again on each pass).
        d = x.astype(np.float64)
        n = d.shape[0]
        mean = float(np.add.reduce(d)) / n
        d -= mean
        return float(n), mean, float(np.einsum("i,i->", d, d))

    def comoments(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if x.dtype != np.float32 or y.dtype != np.float32 or not x.size:
            return super().comoments(x, y)
        # float32 values: cast once each and centre in place (as ``moments``)
        dx, dy = x.astype(np.float64), y.astype(np.float64)
        n = dx.shape[0]
        mean_x, mean_y = float(np.add.reduce(dx)) / n, float(np.add.reduce(dy)) / n
        dx -= mean_x
        dy -= mean_y
        dot = lambda a, b: float(np.einsum("i,i->", a, b))  # noqa: E731
        return float(n), mean_x, mean_y, dot(dx, dx), dot(dy, dy), dot(dx, dy)

    def numel(self, x: np.ndarray) -> int:
        return int(x.size)

    def minus64(self, x: np.ndarray, value: float) -> np.ndarray:
        return np.subtract(x, value, dtype=np.float64)

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        # einsum, not np.dot: BLAS would sum float32 in float32, and its threads spin on a loaded 2-core
        # machine (measured 4.8 us to 2.2 ms for the same 64k-element dot); einsum is single-threaded, casts
        # to float64 in small buffers and allocates nothing.
        if not a.size:
            return 0.0
        return float(np.einsum("i,i->", a, b, dtype=np.float64))

    def count(self, cond: np.ndarray) -> int:
        return int(np.count_nonzero(cond))

    def max(self, x: np.ndarray) -> float:
        return float(np.max(x)) if x.size else float("-inf")

    def bin_counts(self, x: np.ndarray, edges: np.ndarray) -> np.ndarray:
        nan = int(np.count_nonzero(np.isnan(x)))
        table = bin_table(edges) if x.dtype == np.float32 and not nan else None
        if table is None:
            with np.errstate(invalid="ignore"):  # signalling NaN payloads cast to float64
                index = np.searchsorted(edges, x, side="right")  # NaN sorts last: into the top bin, taken out below
        else:
            # Two lookups by the value's top 16 bits and one comparison, instead of a binary search over the
            # edges (which cost 20 ns a token, three times the rest of the engine): the same bins exactly.
            base, edge = table
            cell = x.view(np.uint32) >> 16
            index = base.take(cell) + (x >= edge.take(cell))
        counts = np.bincount(index, minlength=edges.shape[0] + 1).astype(np.int64)
        counts[-1] -= nan
        return counts

    def min(self, x: np.ndarray) -> float:
        return float(np.min(x)) if x.size else float("inf")

    def to_int64(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.int64)

    def int32_bits(self, x: np.ndarray) -> np.ndarray:
        return x.view(np.int32)

    def repeat(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return np.repeat(values, counts)

    def searchsorted(self, edges: np.ndarray, x: np.ndarray, right: bool) -> np.ndarray:
        return np.searchsorted(edges, x, side="right" if right else "left")

    def bincount(self, index: np.ndarray, size: int) -> np.ndarray:
        return np.bincount(index, minlength=size)

    def scatter_add(self, index: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
        return np.bincount(index, weights, minlength=size).astype(np.float64, copy=False)  # (int64 when empty)

    def scatter_extreme(
        self, index: np.ndarray, values: np.ndarray, size: int, largest: bool, fill: float
    ) -> np.ndarray:
        out = np.full(size, fill)
        (np.maximum if largest else np.minimum).at(out, index, values)
        return out


# ------------------------------------------------------------------------------------------------------ torch


class _TorchSegments(Segments):
    def __init__(self, torch: Any, lengths: np.ndarray, device: Any) -> None:
        self.torch = torch
        self.n_rows = int(lengths.shape[0])
        self.n_tokens = int(lengths.sum())
        nonempty = lengths > 0
        self.all_nonempty = bool(nonempty.all())
        self.nonempty = torch.from_numpy(nonempty).to(device)
        self.lengths = torch.from_numpy(lengths[nonempty]).to(device)
        self.device = device

    def _reduce(self, x: Any, how: str, fill: float) -> Any:
        torch = self.torch
        if self.n_tokens == 0:
            return torch.full((self.n_rows,), fill, dtype=x.dtype, device=self.device)
        reduced = torch.segment_reduce(x, how, lengths=self.lengths)
        if self.all_nonempty:
            return reduced
        out = torch.full((self.n_rows,), fill, dtype=x.dtype, device=self.device)
        out[self.nonempty] = reduced
        return out

    def sum(self, x: Any) -> Any:
        return self._reduce(x.to(self.torch.float64), "sum", 0.0)

    def max(self, x: Any, empty: float) -> Any:
        return self._reduce(x, "max", empty)

    def min(self, x: Any, empty: float) -> Any:
        return self._reduce(x, "min", empty)


class TorchBackend(Backend):
    """torch backend, used for ``--device cuda`` (it also runs on a CPU device, for parity tests)."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.name = str(self.device)

    @cached_property
    def passes(self) -> TokenPasses:
        """torch's elementwise operations and segment reductions."""
        from rcdiag.metrics.token_passes import ArrayPasses

        return ArrayPasses()

    def asarray(self, values: np.ndarray) -> Any:
        values = np.ascontiguousarray(values)
        if not values.flags.writeable:  # Arrow's zero-copy buffers: torch wants memory it may write, so copy
            values = values.copy()
        tensor = self.torch.from_numpy(values)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.detach().cpu().numpy()

    def segments(self, lengths: np.ndarray) -> Segments:
        return _TorchSegments(self.torch, lengths, self.device)

    def exp(self, x: Any) -> Any:
        return self.torch.exp(x)

    def expm1(self, x: Any) -> Any:
        return self.torch.expm1(x)

    def to_float32(self, x: Any) -> Any:
        return x.to(self.torch.float32)

    def to_float64(self, x: Any) -> Any:
        return x.to(self.torch.float64)

    def abs(self, x: Any) -> Any:
        return self.torch.abs(x)

    def clip(self, x: Any, lo: float | None, hi: float | None) -> Any:
        return self.torch.clamp(x, lo, hi)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.torch.where(cond, a, b)

    def sum(self, x: Any) -> float:
        return float(x.to(self.torch.float64).sum().item()) if x.numel() else 0.0

    def numel(self, x: Any) -> int:
        return int(x.numel())

    def minus64(self, x: Any, value: float) -> Any:
        return x.to(self.torch.float64) - value

    def dot(self, a: Any, b: Any) -> float:
        f64 = self.torch.float64
        return float((a.to(f64) * b.to(f64)).sum().item()) if a.numel() else 0.0

    def count(self, cond: Any) -> int:
        return int(self.torch.count_nonzero(cond).item())

    def max(self, x: Any) -> float:
        return float(x.max().item()) if x.numel() else float("-inf")

    def bin_counts(self, x: Any, edges: np.ndarray) -> np.ndarray:
        finite = x[~self.torch.isnan(x)]
        bounds = self.torch.as_tensor(edges, dtype=finite.dtype, device=finite.device)
        index = self.torch.bucketize(finite, bounds, right=True)
        return self.torch.bincount(index, minlength=edges.shape[0] + 1).cpu().numpy().astype(np.int64)

    def min(self, x: Any) -> float:
        return float(x.min().item()) if x.numel() else float("inf")

    def to_int64(self, x: Any) -> Any:
        return x.to(self.torch.int64)

    def int32_bits(self, x: Any) -> Any:
        return x.view(self.torch.int32)

    def repeat(self, values: Any, counts: Any) -> Any:
        return self.torch.repeat_interleave(values, counts)

    def searchsorted(self, edges: Any, x: Any, right: bool) -> Any:
        return self.torch.searchsorted(edges, x, right=right)

    def bincount(self, index: Any, size: int) -> Any:
        return self.torch.bincount(index, minlength=size)

    def scatter_add(self, index: Any, weights: Any, size: int) -> Any:
        return self.torch.zeros(size, dtype=self.torch.float64, device=self.device).index_add_(0, index, weights)

    def scatter_extreme(self, index: Any, values: Any, size: int, largest: bool, fill: float) -> Any:
        out = self.torch.full((size,), fill, dtype=self.torch.float64, device=self.device)
        return out.scatter_reduce_(0, index, values, "amax" if largest else "amin", include_self=True)


def get_backend(device: str = "cpu") -> Backend:
    """``cpu`` (numpy), ``cuda`` / ``cuda:N`` (torch), or ``auto`` (cuda when torch sees a GPU, else cpu)."""
    from rcdiag.runtime.errors import ConfigError
    from rcdiag.settings.constants import DEVICES

    if device == "cpu":
        return NumpyBackend()
    if device == "auto" or device.startswith("cuda"):
        try:
            import torch
        except ImportError:
            if device == "auto":
                return NumpyBackend()
            raise ConfigError(
                f"device '{device}' needs PyTorch, which is not installed (pip install 'rcdiag[gpu]')."
            ) from None
        if not torch.cuda.is_available():
            if device == "auto":
                return NumpyBackend()
            raise ConfigError(f"device '{device}': no CUDA device is available (use device 'cpu' or 'auto').")
        return TorchBackend("cuda" if device == "auto" else device)
    if device == "torch-cpu":  # torch on the CPU: slower than numpy; for parity checks without a GPU
        try:
            return TorchBackend("cpu")
        except ImportError:
            raise ConfigError("device 'torch-cpu' needs PyTorch, which is not installed.") from None
    raise ConfigError(f"Unknown device '{device}'. Use one of {', '.join(DEVICES)}.")
