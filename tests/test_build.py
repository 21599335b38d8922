"""What the compiler made of the kernels: optimizations the source asks for are in the binary."""
import platform
import re
import shutil
import subprocess

import pytest

from rmqstore import _columns, _index, _read


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="reads x86-64 code with objdump")
@pytest.mark.parametrize("module", [_index, _columns, _read], ids=lambda m: m.__name__)
def test_record_prefetches_are_compiled_in(module):
    """The kernels that read records in an order the hardware cannot guess (index hits,
    consume-queue entries) prefetch them. GCC took a function that only prefetches for
    pure and deleted its calls, leaving none in _columns or in _index's read-back;
    rmq_prefetch keeps them."""
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", module.__file__], capture_output=True,
                          text=True, check=True).stdout
    prefetching = set()   # the functions holding a prefetch instruction (not a name with "prefetch" in it)
    for block in code.split("\n\n"):
        lines = block.strip().splitlines()
        if lines and "<" in lines[0] and any(re.search(r"\tprefetch(t[012]|nta|w)\b", x) for x in lines[1:]):
            prefetching.add(lines[0].split("<", 1)[1].rstrip(">:"))
    # the loop's function, or one it may be inlined into
    wanted = {_index: ("find_hits", "keyed_batch", "query_many"), _columns: ("find_records", "decode_entries"),
              _read: ("prefetch_at",)}[module]
    assert any(w in name for w in wanted for name in prefetching), sorted(prefetching)
