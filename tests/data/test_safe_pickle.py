"""``clbench.data.safe_pickle``: a received dataset pickle cannot run code, crash Python, or make
it allocate more than the file holds; every refusal is one line naming the file.

The hostile files are a few bytes to 1 MB, built opcode by opcode. The ones that would crash
or exhaust an unchecked reader are read in a child process, which also reports its peak
memory, so a regression fails the test instead of killing the test run.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from clbench.data import safe_pickle
from dataset_layouts import python2_pickle
from clbench.errors import UserError

P2, P4 = b"\x80\x02", b"\x80\x04"


def _int(n: int) -> bytes:
    """LONG1: any int in a few bytes."""
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _str(s: str) -> bytes:
    return b"X" + len(s.encode()).to_bytes(4, "little") + s.encode()


# name -> (pickle bytes, what the one-line error says)
HOSTILE = {
    # a frozenset over a tuple nested a million deep: hashing it overflows the C stack (a segfault)
    "deep tuple": (P4 + b"(N" + b"\x85" * 1_000_000 + b"\x91.", "nest more than 100 deep"),
    "deep lists": (P2 + b"]" * 5000 + b"a" * 4999 + b".", "nest more than 100 deep"),
    "bytearray(20e9)": (P2 + b"cbuiltins\nbytearray\n" + _int(20 * 10**9) + b"\x85R.", "names builtins.bytearray"),
    "ndarray((3e9,))": (P2 + b"cnumpy\nndarray\n" + _int(3 * 10**9) + b"\x85\x85R.", "calls numpy.ndarray directly"),
    "_reconstruct of 3e9": (P2 + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _int(3 * 10**9)
                            + b"\x85C\x01b\x87R.", "_reconstruct is called other than as NumPy pickles"),
    "object array of 3e9": (P2 + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R(K\x01"
                            + _int(3 * 10**9) + b"\x85cnumpy\ndtype\n" + _str("O8") + b"\x89\x88\x87R(K\x03" + _str("|")
                            + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tb\x89]tb.", "holds Python objects"),
    "array larger than its data": (P2 + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R"
                                   b"(K\x01" + _int(10**9) + b"\x85cnumpy\ndtype\n" + _str("u1")
                                   + b"\x89\x88\x87R(K\x03"
                                   + _str("|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89C\x03abctb.",
                                   "declares shape (1000000000,) of uint8 (1000000000 bytes) but carries 3 bytes"),
    "memo index 2**32-1": (P2 + b"Nr\xff\xff\xff\xff.", "memo entry 4294967295"),
    "bytes8 of 1 TiB": (P4 + b"\x8e" + (2**40).to_bytes(8, "little") + b"abc.", "not a readable pickle"),
    "two million empty sets": (P4 + b"(" + b"\x8f" * 2_000_000 + b"l.", "far more objects than a file of its size"),
    "a list holding itself": (P2 + b"]q\x00h\x00a.", "cycle"),
}
# allowed names called with arguments no pickler writes: LookupError, TypeError... before
BAD_CALLS = {
    "unknown codec": P2 + b"c_codecs\nencode\n" + _str("a") + _str("nope") + b"\x86R.",
    "codec of an int": P2 + b"c_codecs\nencode\nK\x01" + _str("latin1") + b"\x86R.",
    "unknown dtype": P2 + b"cnumpy\ndtype\n" + _str("zzz") + b"\x89\x88\x87R.",
    "set of a list of lists": P2 + b"cbuiltins\nset\n]]a\x85R.",
    "scalar without data": P2 + b"cnumpy.core.multiarray\nscalar\ncnumpy\ndtype\n" + _str("i8")
                           + b"\x89\x88\x87R\x85R.",
    "truncated": P2 + b"]q\x00(K\x01K\x02",
    "not a pickle": b"\x80\x04garbage",
}

CHILD = """
import json, resource, sys
from clbench.data import safe_pickle
from clbench.errors import UserError
out = {}
for path in sys.argv[1:]:
    try:
        safe_pickle.load(path, fix="FIX", encoding="bytes")
        out[path] = "loaded"
    except UserError as err:
        out[path] = str(err)
# this process's peak (VmHWM starts afresh at exec, ru_maxrss keeps the parent's from before it)
status = open("/proc/self/status").read() if sys.platform == "linux" else ""
peak = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
out["maxrss_mb"] = (peak[0] if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024
print(json.dumps(out))
"""


def test_hostile_pickles_are_refused_in_one_line_without_crashing_or_allocating(tmp_path):
    paths = {}
    for i, (name, (data, _)) in enumerate(HOSTILE.items()):
        paths[name] = tmp_path / f"hostile_{i}.pkl"
        paths[name].write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths.values())], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr  # a segfault is -11 (exit 139 from a shell)
    out = json.loads(proc.stdout)
    for name, (_, says) in HOSTILE.items():
        text = out[str(paths[name])]
        assert text.startswith(f"{paths[name]}: ") and says in text and text.endswith("(FIX)"), (name, text)
        assert "\n" not in text
    assert out["maxrss_mb"] < 200, out["maxrss_mb"]  # each asks for GBs unchecked; Python and NumPy take ~30 MB


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_arguments_and_damaged_files_are_one_line_errors(tmp_path, name):
    path = tmp_path / "f.pkl"
    path.write_bytes(BAD_CALLS[name])
    with pytest.raises(UserError) as err:
        safe_pickle.load(path, fix="re-download it", encoding="bytes")
    text = str(err.value)
    assert text.startswith(f"{path}: ") and text.endswith("(re-download it)") and "\n" not in text
    assert "refused to unpickle" in text or "not a readable pickle" in text


def test_a_file_larger_than_the_dataset_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps(bytes(2048)))
    with pytest.raises(UserError, match=r"\d+ bytes, more than the 1024 a file of this dataset can be"):
        safe_pickle.load(path, fix="x", max_bytes=1024)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_what_pickle_and_numpy_write_still_loads_as_plain_arrays(tmp_path, protocol):
    x = np.arange(12, dtype=np.uint8).reshape(3, 4)
    obj = {b"data": x, b"f": np.asfortranarray(x.astype(np.float32)), b"labels": [1, 2], b"n": np.int64(7),
           b"s": {1, 2}, b"fs": frozenset({b"a"}), b"t": (1.5, None, True), b"b": b"\x00\xff"}
    path = tmp_path / "ok.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    got = safe_pickle.load(path, fix="x", encoding="bytes")
    assert type(got[b"data"]) is np.ndarray and np.array_equal(got[b"data"], x)
    assert np.array_equal(got[b"f"], x) and got[b"f"].dtype == np.float32
    assert got[b"n"] == 7 and got[b"s"] == {1, 2} and got[b"t"] == (1.5, None, True) and got[b"b"] == b"\x00\xff"


def test_the_official_cifar_batches_format_loads(tmp_path):
    """Python 2's cPickle, as the real batches are: memo from 1, dtype flags as ints 0/1."""
    x = (np.arange(2 * 3072) % 251).astype(np.uint8).reshape(2, 3072)
    path = tmp_path / "data_batch_1"
    path.write_bytes(python2_pickle({b"labels": [3, 9], b"data": x, b"filenames": [b"a.png", b"b.png"]}))
    got = safe_pickle.load(path, fix="x", encoding="bytes")
    assert np.array_equal(got[b"data"], x) and got[b"labels"] == [3, 9] and got[b"filenames"] == [b"a.png", b"b.png"]


def test_a_payload_names_its_global_before_anything_is_unpickled(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(P2 + b"cos\nsystem\n" + _str(f"touch {marker}") + b"\x85R.")
    with pytest.raises(UserError, match="refused to unpickle: the file names os.system"):
        safe_pickle.load(path, fix="x")
    assert not marker.exists()
