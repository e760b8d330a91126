import pytest

from sim.units import (
    format_bandwidth,
    format_bytes,
    format_flops,
    format_seconds,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_seconds,
)


@pytest.mark.parametrize("text, value", [
    ("80 GiB", 80 * 2**30), ("141 GB", 141e9), ("25 MiB", 25 * 2**20), ("1.5 kB", 1500.0), ("512 bytes", 512.0),
])
def test_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text, value", [
    ("450 GB/s", 450e9), ("400 Gb/s", 50e9), ("200 Gbps", 25e9), ("3.35 TB/s", 3.35e12),
])
def test_bandwidth_bits_and_bytes(text, value):
    assert parse_bandwidth(text) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize("text, value", [("2 us", 2e-6), ("2 µs", 2e-6), ("1.5 ms", 1.5e-3), ("3 s", 3.0)])
def test_seconds(text, value):
    assert parse_seconds(text) == pytest.approx(value, rel=1e-15)


def test_flops():
    assert parse_flops("989 TFLOPS") == 989e12
    assert parse_flops("1.2 PFLOP/s") == pytest.approx(1.2e15)


def test_plain_numbers_are_si():
    assert parse_bytes(1024) == 1024.0
    assert parse_seconds(0.5) == 0.5


@pytest.mark.parametrize("parse, text, fragment", [
    (parse_bytes, "80 GX", "unknown unit 'GX'"),
    (parse_bytes, "80", "has no unit"),
    (parse_bandwidth, "fast", "cannot read"),
    (parse_seconds, "-1 s", "non-negative"),
    (parse_bytes, True, "expected a size"),
])
def test_bad_quantities(parse, text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse(text)


@pytest.mark.parametrize("value, parse, fmt", [
    (80 * 2**30, parse_bytes, format_bytes), (141e9, parse_bytes, format_bytes),
    (450e9, parse_bandwidth, format_bandwidth), (2.3e-6, parse_seconds, format_seconds),
    (989e12, parse_flops, format_flops), (0.0, parse_seconds, format_seconds),
])
def test_format_round_trips(value, parse, fmt):
    assert parse(fmt(value)) == pytest.approx(value, rel=1e-12)


def test_format_is_readable():
    assert format_bytes(80 * 2**30) == "80 GiB"
    assert format_bandwidth(450e9) == "450 GB/s"
    assert format_seconds(2e-6) == "2 us"
    assert format_flops(1979e12) == "1979 TFLOPS"
