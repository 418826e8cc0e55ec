"""One way to compare floating-point outputs across kernels: bound the largest difference relative to the scale of
the reference (its largest magnitude), not element by element and not in absolute units. Two fp32 kernels that
compute the same function differ by a few units in the last place of the values they sum, so the bound follows
the output's scale; a real error (a wrong gate, a head left in) moves the output by far more, and every test that
uses this also shows that its planted error exceeds the bound."""

from __future__ import annotations

FP32_REL = 1e-5  # about 80 fp32 ulp of the output's largest value: room for a reordered sum, not for a wrong head


def max_rel_diff(actual, expected) -> float:
    """max |actual − expected| ÷ max |expected| (tensors or arrays of the same shape)."""
    scale = float(abs(expected).max())
    return float(abs(actual - expected).max()) / max(scale, 1e-30)


def assert_close_to_scale(actual, expected, rel: float = FP32_REL, msg: str = "") -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape, msg)
    d = max_rel_diff(actual, expected)
    assert d <= rel, f"{msg}: largest difference {d:.3g} of the output's scale, above {rel:g}"


def assert_detectable(changed, reference, rel: float = FP32_REL, factor: float = 100.0, msg: str = "") -> None:
    """The planted change moves the output by at least `factor` times the tolerance: a bound that hid it would fail."""
    d = max_rel_diff(changed, reference)
    assert d >= factor * rel, f"{msg}: the change moves the output by only {d:.3g} of its scale"
