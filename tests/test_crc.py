"""BODYCRC: the carry-less-multiply CRC-32 (cext/rmq_crc.c) against zlib's, over every
length and alignment its folding paths split on, and its constants derived again from
the polynomial."""
import os
import re
import zlib
from pathlib import Path

import pytest

from rmqstore._record import crc32_body

SOURCE = Path(__file__).resolve().parents[1] / "cext" / "rmq_crc.c"
POLY = 0x104C11DB7   # CRC-32, x^32 + x^26 + ... + 1


def xpow_mod(n):
    r = 1 << n
    while r.bit_length() >= 33:
        r ^= POLY << (r.bit_length() - 33)
    return r


def reflect(v, bits):
    return int(format(v, f"0{bits}b")[::-1], 2)


def fold_constant(n):
    return reflect(xpow_mod(n), 32) << 1


def barrett_mu():
    a, q = 1 << 64, 0
    while a.bit_length() >= POLY.bit_length():
        shift = a.bit_length() - POLY.bit_length()
        q |= 1 << shift
        a ^= POLY << shift
    return reflect(q, 33)


@pytest.mark.skipif(not SOURCE.exists(), reason="the C sources are not beside the tests")
def test_the_constants_are_the_polynomials():
    text = SOURCE.read_text()
    consts = {name: [int(v, 16) for v in re.findall(r"0x[0-9a-f]+", rest)]
              for name, rest in re.findall(r"#define (FOLD_4|FOLD_1|FOLD_64|BARRETT) (.*?)/\*", text)}
    assert consts == {
        "FOLD_4": [fold_constant(4 * 128 + 32), fold_constant(4 * 128 - 32)],
        "FOLD_1": [fold_constant(128 + 32), fold_constant(128 - 32)],
        "FOLD_64": [fold_constant(64)],
        "BARRETT": [reflect(POLY, 33), barrett_mu()],
    }


def test_every_length_and_alignment_matches_zlib():
    data = os.urandom(4096 + 64)
    for n in list(range(0, 600)) + [1023, 1024, 1025, 4095, 4096]:
        for start in (0, 1, 7, 15):
            chunk = data[start:start + n]
            assert crc32_body(chunk) == zlib.crc32(chunk) & 0x7FFFFFFF, (n, start)


def test_large_and_patterned_inputs_match_zlib():
    for data in (os.urandom(3 << 20), b"\0" * (1 << 20), b"\xff" * 100_003, bytes(range(256)) * 999):
        assert crc32_body(data) == zlib.crc32(data) & 0x7FFFFFFF
