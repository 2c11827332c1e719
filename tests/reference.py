"""An independent brute-force reference: verl's formulas on padded (B, T) float64 arrays with masked ops.

Written from the specification (shared/reference/verl-rollout-correction.md, sections 5-7), deliberately in a
different shape from rcdiag's ragged streaming engine: one batch, padded, every metric computed directly.
Returns unprefixed keys in verl's order.
"""

from __future__ import annotations

import math

import numpy as np

SAFE = 20.0
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3",
)  # fmt: skip


def _mrow(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = m.sum(1)
    s = np.where(m, x, 0.0).sum(1)
    return np.divide(s, n, out=np.zeros_like(s), where=n > 0)


def _mall(x: np.ndarray, m: np.ndarray) -> float:
    return float(np.where(m, x, 0.0).sum() / m.sum())


def offpolicy(old: np.ndarray, rollout: np.ndarray, m: np.ndarray) -> dict[str, float]:
    mo, mr = _mrow(old, m), _mrow(rollout, m)
    d = old - rollout
    delta = mr - mo
    s = np.where(m, d, 0.0).sum(1)
    with np.errstate(over="ignore", invalid="ignore"):
        return {
            "training_ppl": float(np.exp(-mo).mean()),
            "training_log_ppl": float((-mo).mean()),
            "kl": _mall(rollout - old, m),
            "k3_kl": _mall(np.expm1(d) - d, m),
            "rollout_ppl": float(np.exp(-mr).mean()),
            "rollout_log_ppl": float((-mr).mean()),
            "log_ppl_diff": float(delta.mean()),
            "log_ppl_abs_diff": float(np.abs(delta).mean()),
            "log_ppl_diff_max": float(delta.max()),
            "log_ppl_diff_min": float(delta.min()),
            "ppl_ratio": float(np.exp(delta).mean()),
            "chi2_token": _mall(np.expm1(2 * np.clip(d, -SAFE, SAFE)), m),
            "chi2_seq": float(np.expm1(2 * np.clip(s, -SAFE, SAFE)).mean()),
        }


def parse_is(threshold: float | str) -> tuple[float, float | None]:
    if isinstance(threshold, str) and "_" in threshold:
        lo, hi = threshold.split("_", 1)
        return float(hi), float(lo)
    return float(threshold), None


def importance(
    old: np.ndarray,
    rollout: np.ndarray,
    m: np.ndarray,
    level: str,
    threshold: float | str,
    batch_norm: bool,
    spreads: dict[str, tuple[float, float]] | None = None,
) -> dict[str, float | None]:
    upper, lower = parse_is(threshold)
    lm = lower if lower is not None else 1.0 / upper
    d = old - rollout
    B = m.shape[0]
    if level == "token":
        raw = np.exp(np.clip(d, -SAFE, SAFE))
    else:
        s = np.where(m, d, 0.0).sum(1)
        raw = np.repeat(np.exp(np.clip(s, -SAFE, SAFE))[:, None], m.shape[1], axis=1)
    raw = np.where(m, raw, 0.0)
    w = np.minimum(raw, upper) if lower is None else np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    wv = w[m]
    n = wv.size
    mean = float(wv.mean())
    out: dict[str, float | None] = {}
    if level == "sequence":
        s = np.where(m, d, 0.0).sum(1)
        out["rollout_is_max"] = math.exp(min(float(s.max()), SAFE))
        out["rollout_is_min"] = math.exp(float(s.min())) if s.min() > -700 else 0.0
        out["rollout_is_mean"] = mean
        out["rollout_is_ratio_fraction_high"] = float((s > math.log(upper)).mean())
        out["rollout_is_ratio_fraction_low"] = float((s < math.log(lm)).mean())
    else:
        out["rollout_is_mean"] = mean
        out["rollout_is_ratio_fraction_high"] = float((raw[m] > upper).mean())
        out["rollout_is_ratio_fraction_low"] = float((raw[m] < lm).mean())
        out["rollout_is_max"] = float(wv.max())
        out["rollout_is_min"] = float(wv.min())
    wc = np.clip(wv, 0.0, upper)
    out["rollout_is_std"] = float(wc.std()) if n > 1 else 0.0
    if spreads is not None:
        # verl's weights differ from these by float32 rounding of exp (and of S_i, a float32 sum, at sequence level)
        row_abs = np.where(m, np.abs(d), 0.0).sum(1, keepdims=True) if level == "sequence" else 0.0
        spreads["rollout_is_std"] = (float((wc * wc).mean()), float((w * (1.0 + row_abs))[m].max()))
    second = float(((wc / (wc.mean() + 1e-8)) ** 2).mean())
    out["rollout_is_eff_sample_size"] = 1.0 / second if second > 0 else None
    a = _mrow(w, m)
    out["rollout_is_seq_mean"] = float(a.mean())
    out["rollout_is_seq_std"] = float(a.std(ddof=1)) if B > 1 else 0.0
    out["rollout_is_seq_max"] = float(a.max())
    out["rollout_is_seq_min"] = float(a.min())
    out["rollout_is_seq_max_deviation"] = float(np.abs(a - 1).max())
    rm = _mrow(raw, m)
    out["rollout_is_seq_fraction_high"] = float((rm > upper).mean())
    out["rollout_is_seq_fraction_low"] = float((rm < lm).mean())
    if lower is not None:
        out["rollout_is_oob_ratio"] = float(((raw[m] < lower) | (raw[m] > upper)).mean())
    if batch_norm:
        if level == "token":
            f = mean
        else:
            valid = m.any(1)
            f = float(a[valid].sum() / max(valid.sum(), 1e-8))
        out["rollout_is_batch_norm_factor"] = f if f > 1e-8 else 1.0
    return out


def parse_rs(options: str, spec: str | float) -> list[tuple[str, float | None, float]]:
    names: list[str] = []
    for name in (o.strip() for o in options.split(",")):
        if name and name not in names:
            names.append(name)
    specs = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    out = []
    for name, text in zip(names, specs, strict=True):
        if name.endswith("k1"):
            if "_" in text:
                lo, hi = (float(v) for v in text.split("_", 1))
            else:
                hi = float(text)
                lo = 1.0 / hi
            out.append((name, lo, hi))
        else:
            out.append((name, None, float(text)))
    return out


def rejection(
    old: np.ndarray,
    rollout: np.ndarray,
    m: np.ndarray,
    options: str,
    spec: str | float,
    spreads: dict[str, tuple[float, float]] | None = None,
) -> dict[str, float]:
    d = np.clip(old - rollout, -SAFE, SAFE)
    stats = {"k1": -d, "k2": 0.5 * d**2, "k3": np.expm1(d) - d}
    # the size of verl's float32 rounding per token: its k3 is exp(d) - 1 - d (an ulp of e^d); k1, k2 are exact
    # float32 operations, the same as rcdiag's, until verl sums them per row in float32
    exact = {"k1": np.zeros_like(d), "k2": np.zeros_like(d), "k3": np.exp(d)}
    valid = m.any(1)
    out: dict[str, float] = {}
    reject_any = np.zeros_like(m)
    for name, lo, hi in parse_rs(options, spec):
        agg, est = name.rsplit("_", 1)
        k = stats[est]
        k1 = est == "k1"
        thr_hi = math.log(hi) if k1 else hi
        thr_lo = math.log(lo) if k1 else 0.0
        if agg == "token":
            tok = k
            keep = (tok >= thr_lo) & (tok <= thr_hi) if k1 else tok <= thr_hi
            seq_vals = _mrow(tok, m)
            scale = exact[est]
        else:
            rounding = np.where(m, np.abs(k) + exact[est], 0.0)
            scale = np.repeat(
                rounding.sum(1, keepdims=True) if agg != "seq_max" else rounding.max(1, keepdims=True), m.shape[1], 1
            )
            if agg == "seq_sum":
                seq = np.where(m, k, 0.0).sum(1)
            elif agg == "seq_mean":
                seq = _mrow(k, m)
            else:
                seq = np.where(m, k, -np.inf).max(1)
                seq = np.where(np.isneginf(seq), 0.0, seq)
            keep_row = (seq >= thr_lo) & (seq <= thr_hi) if k1 else seq <= thr_hi
            keep = np.repeat(keep_row[:, None], m.shape[1], 1)
            tok = np.repeat(seq[:, None], m.shape[1], 1)
            seq_vals = seq
        p = f"rollout_rs_{name}_"
        v = seq_vals[valid]
        out[p + "mean"] = _mall(tok, m)
        if agg == "token":
            out[p + "max"] = float(tok[m].max())
            out[p + "min"] = float(tok[m].min())
            out[p + "fraction_high"] = float((tok[m] > thr_hi).mean())
            out[p + "fraction_low"] = float((tok[m] < thr_lo).mean()) if k1 else 0.0
        else:
            out[p + "max"] = float(v.max())
            out[p + "min"] = float(v.min())
            out[p + "fraction_high"] = float((v > thr_hi).mean())
            out[p + "fraction_low"] = float((v < thr_lo).mean()) if k1 else 0.0
        c = np.clip(tok[m], thr_lo, thr_hi)
        out[p + "std"] = float(c.std()) if m.sum() > 1 else 0.0
        if spreads is not None:
            spreads[p + "std"] = (float((c * c).mean()), float(scale[m].max()))
        out[p + "seq_mean"] = float(v.mean())
        out[p + "seq_std"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
        out[p + "seq_max"] = float(v.max())
        out[p + "seq_min"] = float(v.min())
        out[p + "seq_max_deviation"] = float(np.abs(v).max())
        out[p + "seq_fraction_high"] = float((v > thr_hi).mean())
        if k1:
            out[p + "seq_fraction_low"] = float((v < thr_lo).mean())
        rejected = ~keep & m
        out[p + "masked_fraction"] = float(rejected.sum() / m.sum())
        out[p + "seq_masked_fraction"] = float(rejected.any(1)[valid].mean())
        reject_any |= rejected
    out["rollout_rs_masked_fraction"] = float(reject_any.sum() / m.sum())
    out["rollout_rs_seq_masked_fraction"] = float(reject_any.any(1).mean())
    return out


def debug(
    old: np.ndarray, rollout: np.ndarray, m: np.ndarray, raises_on_empty: bool = False
) -> dict[str, float | None]:
    """verl's ``training/*`` debug metrics (``calculate_debug_metrics``), in float64 with numpy's own functions:
    |exp(old) - exp(rollout)| over the valid tokens (max, mean, std with ddof 1) and ``np.corrcoef`` of the two
    probabilities. No valid token: valid 0 and NaN (verl >= 0.8.0), or ``None`` everywhere (0.7.1 raises)."""
    keys = ("valid", "max", "mean", "std")
    names = [f"training/rollout_probs_diff_{k}" for k in keys] + ["training/rollout_actor_probs_pearson_corr"]
    p_old, p_rollout = np.exp(old[m]), np.exp(rollout[m])
    if not p_old.size:
        return dict.fromkeys(names) if raises_on_empty else dict(zip(names, [0.0] + [math.nan] * 4, strict=True))
    diff = np.abs(p_old - p_rollout)
    with np.errstate(all="ignore"):
        corr = float(np.clip(np.corrcoef(p_old, p_rollout)[0, 1], -1, 1)) if p_old.size > 1 else math.nan
    std = float(diff.std(ddof=1)) if diff.size > 1 else math.nan
    return dict(zip(names, [1.0, float(diff.max()), float(diff.mean()), std, corr], strict=True))


def all_metrics(
    old: np.ndarray,
    rollout: np.ndarray,
    mask: np.ndarray,
    spreads: dict[str, tuple[float, float]] | None = None,
    **config: object,
) -> dict[str, float | None]:
    """Every ``training/*`` (decoupled mode: ``bypass_mode`` false) and ``rollout_corr/*`` metric verl would log for
    one padded batch and config.

    ``spreads``, if given, receives for each population ``*_std`` metric (unprefixed key) E[x^2] of the (clamped)
    values behind it, and the magnitude whose float32 rounding separates verl's values from exact ones (for the
    conformance tolerance)."""
    old = old.astype(np.float64)
    rollout = rollout.astype(np.float64)
    m = mask.astype(bool)
    out: dict[str, float | None] = {}
    if config.get("rollout_is") is not None:
        out.update(
            importance(
                old,
                rollout,
                m,
                str(config["rollout_is"]),
                config.get("rollout_is_threshold", 2.0),  # type: ignore[arg-type]
                bool(config.get("rollout_is_batch_normalize", False)),
                spreads,
            )
        )
    if config.get("rollout_rs") is not None:
        options, spec = str(config["rollout_rs"]), config["rollout_rs_threshold"]
        out.update(rejection(old, rollout, m, options, spec, spreads))  # type: ignore[arg-type]
    out.update(offpolicy(old, rollout, m))
    logged = {} if config.get("bypass_mode") else debug(old, rollout, m, config.get("verl_version") == "0.7.1")
    return {**logged, **{"rollout_corr/" + k: v for k, v in out.items()}}
