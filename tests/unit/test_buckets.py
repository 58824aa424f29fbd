from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskqueue.core.buckets import cpu_time_bucket, significant_bits_bucket
from taskqueue.core.errors import InvalidInputError
from taskqueue.core.settings import DEFAULT_CPU_SEGMENTS


@pytest.mark.parametrize(("value", "bucket"), [
    (0, 0), (1, 1), (7, 7), (8, 8), (9, 10), (10, 10), (11, 12), (17, 20), (100, 112),
    (3000, 3072), (2000, 2048), (4096, 4096), (4097, 5120),
])
def test_significant_bits_rounds_up_to_three_bits(value: int, bucket: int) -> None:
    assert significant_bits_bucket(value, 3) == bucket


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=8))
def test_significant_bits_bucket_is_an_upper_bound_with_few_bits(value: int, bits: int) -> None:
    bucket = significant_bits_bucket(value, bits)
    assert bucket >= value
    if bucket:
        # at most `bits` significant bits: the bucket is m << s with m < 2**bits
        trailing = (bucket & -bucket).bit_length() - 1
        assert (bucket >> trailing).bit_length() <= bits
    # rounding never more than one unit of the last kept bit
    assert bucket - value < max(1, 1 << max(value.bit_length() - bits, 0))


@pytest.mark.parametrize(("seconds", "bucket"), [
    (0, 360), (1, 360), (360, 360), (361, 1800), (3600, 3600), (3601, 7200), (7201, 21600),
    (86400, 86400), (90000, 172800), (1080000, 1080000), (1080001, 2160000),
])
def test_cpu_time_rounds_up_to_segments(seconds: int, bucket: int) -> None:
    assert cpu_time_bucket(seconds, DEFAULT_CPU_SEGMENTS) == bucket


def test_negative_values_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="negative"):
        cpu_time_bucket(-1, DEFAULT_CPU_SEGMENTS)
    with pytest.raises(InvalidInputError, match="negative"):
        significant_bits_bucket(-5)
