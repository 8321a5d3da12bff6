"""``clbench data check``: layout and count summaries, and one-line errors naming what is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clbench.cli.data import main
from clbench.cli.data_check import check
from clbench.errors import UserError
from dataset_layouts import write_cifar10, write_core50, write_office_home

CORE50 = "clbench.benchmarks.core50:core50"
OFFICE_HOME = "clbench.benchmarks.office_home:office_home"
CIFAR10 = "clbench.benchmarks.cifar10:cifar10_dirichlet"
OBJECTS = "objects=[1,2,6]"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    return {
        "core50": write_core50(tmp / "core50", objects=[1, 2, 6], frames=5),
        "office-home": write_office_home(tmp, classes=["Bed", "Mug", "Pen"], per_class=5),
        "cifar10": write_cifar10(tmp, train_per_class=30, test_per_class=10),
    }


def test_check_summarises_each_stream(roots):
    core = check(CORE50, str(roots["core50"]), objects=[1, 2, 6])
    assert [e.name for e in core.experiences] == [f"s{s}" for s in range(1, 12)]
    assert all((e.train, e.test, e.classes) == (12, 3, [0, 1, 2]) for e in core.experiences)
    assert core.num_classes == 3 and core.images_checked == 11 * 3 * 5
    assert "ni-train-then-test" in core.named_orders

    ni = check(CORE50, str(roots["core50"]), objects=[1, 2, 6], protocol="ni")
    assert len(ni.experiences) == 8 and ni.shared_test and ni.experiences[0].test == 3 * 3 * 5

    oh = check(OFFICE_HOME, str(roots["office-home"]), classes=["Bed", "Mug", "Pen"])
    assert [e.name for e in oh.experiences] == ["art", "clipart", "product", "real_world"]
    assert all((e.train, e.test) == (12, 3) for e in oh.experiences) and oh.images_checked == 4 * 3 * 5

    cifar = check(CIFAR10, str(roots["cifar10"]), min_size=10)
    assert len(cifar.experiences) == 5 and cifar.train_total == 300 and cifar.global_test == 100
    assert sum(e.test for e in cifar.experiences) == 100 and cifar.images_checked == 0
    assert sum(sum(e.train_class_counts.values()) for e in cifar.experiences) == 300


def test_main_prints_a_table(roots, capsys):
    assert main([CORE50, "--root", str(roots["core50"]), OBJECTS, "protocol=ni"]) == 0
    out = capsys.readouterr().out
    rows = [cells[2] for line in out.splitlines() if len(cells := [c.strip() for c in line.split("│")]) > 2]
    assert [r for r in rows if r.startswith("s")] == ["s1", "s2", "s4", "s5", "s6", "s8", "s9", "s11"]
    assert "total" in rows and "same test set" in out
    assert "decoded all 165 image files" in out  # 11 sessions x 3 objects x 5 frames


def test_main_json_and_nested_init_args(roots, capsys):
    assert main([OFFICE_HOME, "--root", str(roots["office-home"]), "classes=[Bed, Mug, Pen]", "domains=[art]",
                 "augment.flip=false", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in summary["experiences"]] == ["art"]
    assert summary["num_classes"] == 3 and summary["images_checked"] == 15


def test_speed_is_measured_through_a_loader(roots, capsys):
    assert main([CORE50, "--root", str(roots["core50"]), OBJECTS, "image_size=16", "--speed", "2",
                 "--workers", "1", "--batch-size", "8", "--no-decode"]) == 0
    out = capsys.readouterr().out
    assert "training images/s with 1 workers" in out and "decoded" not in out


def one_line_error(args) -> str:
    with pytest.raises(UserError) as err:
        main(args)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_root(tmp_path):
    text = one_line_error([CORE50, "--root", str(tmp_path / "missing")])
    assert str(tmp_path / "missing") in text


def test_missing_session_folder(roots, tmp_path):
    dst = tmp_path / "core50"
    shutil.copytree(roots["core50"], dst)
    shutil.rmtree(dst / "core50_128x128" / "s7")
    text = one_line_error([CORE50, "--root", str(dst), OBJECTS])
    assert str(dst / "core50_128x128" / "s7") in text


def test_missing_domain_folder(roots, tmp_path):
    dst = tmp_path / "OfficeHomeDataset_10072016"
    shutil.copytree(roots["office-home"], dst)
    shutil.rmtree(dst / "Clipart")
    assert str(dst / "Clipart") in one_line_error([OFFICE_HOME, "--root", str(dst), "classes=[Bed,Mug,Pen]"])


def test_empty_class_folder(roots, tmp_path):
    dst = tmp_path / "OfficeHomeDataset_10072016"
    shutil.copytree(roots["office-home"], dst)
    for f in (dst / "Product" / "Mug").iterdir():
        f.unlink()
    text = one_line_error([OFFICE_HOME, "--root", str(dst), "classes=[Bed,Mug,Pen]"])
    assert str(dst / "Product" / "Mug") in text


def test_corrupt_image_is_found_by_decoding(roots, tmp_path):
    dst = tmp_path / "core50"
    shutil.copytree(roots["core50"], dst)
    bad = dst / "core50_128x128" / "s10" / "o6" / "C_10_06_003.png"
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])  # truncated
    text = one_line_error([CORE50, "--root", str(dst), OBJECTS])
    assert str(bad) in text and "cannot decode" in text
    assert main([CORE50, "--root", str(dst), OBJECTS, "--no-decode"]) == 0  # layout and counts are fine


def test_bad_command_lines():
    assert "--root" in one_line_error([CORE50])
    assert "reads no dataset" in one_line_error(["digits-domains", "--root", "/tmp"])
    assert "unknown argument 'protocl'" in one_line_error([CORE50, "--root", "/tmp", "protocl=ni"])
    assert "--root" in one_line_error([CORE50, "--root", "/tmp", "root=/x"])


# -- through the installed command line ---------------------------------------------------------

def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clbench.cli.main", "data", "check", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_cli_check_succeeds_on_a_complete_copy(roots):
    proc = cli("core50", "--root", str(roots["core50"]), OBJECTS)
    assert proc.returncode == 0, proc.stderr
    assert "s11" in proc.stdout and "total" in proc.stdout


@pytest.mark.parametrize("problem", ["missing root", "missing session", "corrupt image", "empty class folder"])
def test_cli_errors_are_one_line_with_exit_status_2(roots, tmp_path, problem):
    if problem == "missing root":
        named = tmp_path / "absent"
        args = ["core50", "--root", str(named)]
    elif problem == "missing session":
        shutil.copytree(roots["core50"], tmp_path / "c")
        named = tmp_path / "c" / "core50_128x128" / "s2"
        shutil.rmtree(named)
        args = ["core50", "--root", str(tmp_path / "c"), OBJECTS]
    elif problem == "corrupt image":
        shutil.copytree(roots["core50"], tmp_path / "c")
        named = tmp_path / "c" / "core50_128x128" / "s5" / "o2" / "C_05_02_001.png"
        named.write_bytes(b"\x89PNG\r\n\x1a\n broken")
        args = ["core50", "--root", str(tmp_path / "c"), OBJECTS]
    else:
        shutil.copytree(roots["office-home"], tmp_path / "OfficeHomeDataset_10072016")
        named = tmp_path / "OfficeHomeDataset_10072016" / "Real World" / "Pen"
        for f in named.iterdir():
            f.unlink()
        args = ["office-home", "--root", str(tmp_path), "classes=[Bed,Mug,Pen]"]
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(named) in lines[0]


class _Payload:
    """What a malicious pickle holds: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os
        import shlex

        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _pickle_to_replace(roots, tmp_path, dataset: str, cifar_file: str) -> tuple:
    """(a pickled file of a fresh dataset tree, the `clbench data check` arguments that read it)."""
    if dataset == "core50":
        dst = write_core50(tmp_path / "c", objects=[1, 2, 6], frames=2, png=False, npz=True)
        return dst / "paths.pkl", ["core50", "--root", str(dst), OBJECTS]
    dst = tmp_path / "cifar-10-batches-py"
    shutil.copytree(roots["cifar10"], dst)
    return dst / cifar_file, ["cifar10-dirichlet", "--root", str(dst), "min_size=1"]


@pytest.mark.parametrize("dataset", ["core50", "cifar10"])
def test_cli_check_refuses_a_pickle_payload_without_running_it(roots, tmp_path, dataset):
    import pickle

    marker = tmp_path / "ran"
    named, args = _pickle_to_replace(roots, tmp_path, dataset, cifar_file="batches.meta")
    with open(named, "wb") as f:
        pickle.dump(_Payload(marker), f)
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{named}: refused to unpickle" in lines[0], proc.stderr


@pytest.mark.parametrize("dataset", ["core50", "cifar10"])
def test_cli_check_refuses_a_pickle_nested_to_crash_python_in_one_line(roots, tmp_path, dataset):
    """A 1 MB frozenset over a tuple nested a million deep: hashing it overflows the C stack, so
    unchecked it is a segfault (exit 139); checked, one line and exit status 2."""
    named, args = _pickle_to_replace(roots, tmp_path, dataset, cifar_file="data_batch_3")
    named.write_bytes(b"\x80\x04(N" + b"\x85" * 1_000_000 + b"\x91.")
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clbench: error: {named}: refused to unpickle: its objects nest "
                                                   "more than 100 deep"), proc.stderr
