"""TensorFlow's GPU stack, made small enough to reach a GPU machine in pieces (issue 44).

The lent GPU machine has no TensorFlow, only CUDA 13 libraries, no package registry, and a
call carries at most 64 MiB. This tool builds, here, an installed tree of what a single-GPU
TensorFlow run needs (``pip install --no-index --target`` of the wheels ``pip download`` gives
for ``tensorflow[and-cuda]``, keras and custom_fit, for the device's Python), removes or stands in
for what one GPU running dense and conv models never loads, and writes it as compressed tar
streams cut into pieces of at most 60 MiB, with a manifest (sizes, SHA-256). On the device,
``install`` checks the pieces and unpacks them into a scratch directory (``benchmarks/gpu/run.sh``).

Subcommands (``python benchmarks/gpu/payload.py SUBCOMMAND --help``):

* ``download``: the wheels, for one Python tag, into a folder.
* ``build``: wheels -> installed tree -> reductions (each one's saving measured) -> parts ->
  pieces + ``manifest.json``.
* ``verify``: every piece's size and SHA-256 against the manifest.
* ``install``: verify, reassemble, decompress and unpack the parts into a directory.
* ``library-path``: the unpacked tree's ``nvidia/*/lib`` folders, for ``LD_LIBRARY_PATH``.

Parts: ``core`` (TensorFlow, keras, custom_fit, the CUDA 12 libraries TensorFlow needs) and
``cudnn`` (cuDNN 9 for CUDA 12 and NVRTC, which only cuDNN's runtime-compiled engines load).
``cudnn`` is optional at install time: without it, ``run.sh`` links the image's own cuDNN 9.
Standard library only: it runs on the device's Python as well as here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

FORMAT = 1
MIB = 2**20
PIECE_BYTES = 60 * MIB  # a call carries 64 MiB, the working tree included
MANIFEST = "manifest.json"
TENSORFLOW = "tensorflow[and-cuda]==2.21.0"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
#: The libraries TensorFlow dlopens at GPU start but a dense/conv benchmark never calls, by the
#: folder under ``nvidia/`` and the SONAME TensorFlow asks for (CUDA 12 builds).
STAND_IN_LIBS = {
    "cufft": "libcufft.so.11",
    "cusolver": "libcusolver.so.11",
    "cusparse": "libcusparse.so.12",
    "curand": "libcurand.so.10",
}
#: Paths (relative to the tree) that go to the ``cudnn`` part when cuDNN is carried.
CUDNN_PREFIXES = ("nvidia/cudnn/", "nvidia/cuda_nvrtc/")
REPO = Path(__file__).resolve().parents[2]


# -- pieces and the manifest ---------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def split_stream(stream: IO[bytes], out_dir: Path, stem: str, piece_bytes: int = PIECE_BYTES) -> dict[str, Any]:
    """Writes ``stream`` to ``out_dir/stem.000``, ``.001``, ... of at most ``piece_bytes`` each.

    Returns:
        ``bytes`` and ``sha256`` of the whole stream, and ``pieces``: ``name``, ``bytes`` and
        ``sha256`` of each piece, in order.
    """
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be positive, received {piece_bytes}")
    whole = hashlib.sha256()
    pieces: list[dict[str, Any]] = []
    total = 0
    out_dir.mkdir(parents=True, exist_ok=True)
    while True:
        name = f"{stem}.{len(pieces):03d}"
        digest, size = hashlib.sha256(), 0
        with open(out_dir / name, "wb") as f:
            while size < piece_bytes:
                block = stream.read(min(MIB, piece_bytes - size))
                if not block:
                    break
                f.write(block)
                digest.update(block)
                whole.update(block)
                size += len(block)
        if size == 0 and pieces:  # the stream ended on a piece boundary
            (out_dir / name).unlink()
            break
        pieces.append({"name": name, "bytes": size, "sha256": digest.hexdigest()})
        total += size
        if size < piece_bytes:
            break
    return {"bytes": total, "sha256": whole.hexdigest(), "pieces": pieces}


def read_manifest(payload: Path) -> dict[str, Any]:
    """The manifest of the payload in ``payload``."""
    manifest = json.loads((payload / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{payload / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def verify(payload: Path, parts: Iterable[str] | None = None, quiet: bool = False) -> list[str]:
    """Checks each piece of ``parts`` (default: all) for size and SHA-256.

    Returns:
        The problems found (empty: every piece is there and intact).
    """
    manifest = read_manifest(payload)
    wanted = set(parts) if parts is not None else None
    problems = []
    for part in manifest["parts"]:
        if wanted is not None and part["name"] not in wanted:
            continue
        for piece in part["pieces"]:
            path = payload / piece["name"]
            if not path.is_file():
                problems.append(f"{piece['name']}: missing")
            elif path.stat().st_size != piece["bytes"]:
                problems.append(f"{piece['name']}: {path.stat().st_size} bytes, expected {piece['bytes']}")
            elif sha256_file(path) != piece["sha256"]:
                problems.append(f"{piece['name']}: SHA-256 differs from the manifest")
            elif not quiet:
                print(f"ok {piece['name']} {piece['bytes']} {piece['sha256'][:16]}", flush=True)
    for tool in manifest.get("tools", []):
        path = payload / tool["name"]
        if path.is_file() and sha256_file(path) != tool["sha256"]:
            problems.append(f"{tool['name']}: SHA-256 differs from the manifest")
    return problems


def present_parts(payload: Path) -> list[str]:
    """The parts whose pieces are all in ``payload`` (sizes checked, not hashes)."""
    manifest = read_manifest(payload)
    return [
        part["name"]
        for part in manifest["parts"]
        if all(
            (payload / p["name"]).is_file() and (payload / p["name"]).stat().st_size == p["bytes"]
            for p in part["pieces"]
        )
    ]


class _Joined:
    """The pieces of one part read as one stream (a file-like ``read``)."""

    def __init__(self, paths: list[Path]):
        self._paths = iter(paths)
        self._file: IO[bytes] | None = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._file is None:
                path = next(self._paths, None)
                if path is None:
                    return b""
                self._file = open(path, "rb")  # noqa: SIM115 (closed at its end)
            block = self._file.read(size)
            if block:
                return block
            self._file.close()
            self._file = None


def _decompressor(compression: dict[str, Any], payload: Path) -> list[str] | None:
    """The command that decompresses stdin to stdout, or None for Python's own lzma."""
    tool = compression["tool"]
    if tool == "xz":
        return ["xz", "-d", "-c", "-T0"] if shutil.which("xz") else None
    if tool == "zstd":
        if shutil.which("zstd"):
            return ["zstd", "-d", "-c", "-q", "--long=31"]
        carried = payload / "zstd"  # a tool the manifest lists, for an image without zstd
        if carried.is_file():
            carried.chmod(0o755)
            return [str(carried), "-d", "-c", "-q", "--long=31"]
        raise RuntimeError("the payload is zstd-compressed and neither zstd nor the carried binary was found")
    if tool == "none":
        return ["cat"]
    raise ValueError(f"unknown compression {tool!r}")


def _safe_members(archive: tarfile.TarFile, dest: Path) -> Iterator[tarfile.TarInfo]:
    for member in archive:
        name = member.name
        if name.startswith("/") or ".." in Path(name).parts:
            raise ValueError(f"unsafe path in the payload: {name}")
        if member.issym() or member.islnk():
            target = member.linkname
            if target.startswith("/") or ".." in Path(target).parts:
                raise ValueError(f"unsafe link in the payload: {name} -> {target}")
        # A link left at the member's path (run.sh --cudnn image links the image's libcudnn*.so.9
        # into nvidia/cudnn/lib) is removed, not followed: tar's filter refuses to write through a
        # link that leaves dest, and without the filter the write would land in the image's file.
        if (dest / name).is_symlink():
            (dest / name).unlink()
        yield member


def install(payload: Path, dest: Path, parts: Iterable[str] | None = None) -> dict[str, Any]:
    """Verifies ``parts`` (default: all whose pieces are present), then unpacks them into ``dest``.

    The reassembled stream of each part is checked against the manifest's SHA-256 as it is read.
    A stamp ``dest/.payload.json`` records what was unpacked: an install of the same payload
    and parts into the same ``dest`` is skipped.

    Returns:
        ``parts`` (installed), ``seconds`` and ``skipped`` (already there).
    """
    manifest = read_manifest(payload)
    names = list(parts) if parts is not None else present_parts(payload)
    if "core" not in names:
        raise RuntimeError(f"the part 'core' is not complete in {payload}")
    stamp = dest / ".payload.json"
    key = {"manifest": sha256_file(payload / MANIFEST), "parts": sorted(names)}
    if stamp.is_file() and json.loads(stamp.read_text()) == key:
        return {"parts": names, "seconds": 0.0, "skipped": True}
    problems = verify(payload, names, quiet=True)
    if problems:
        raise RuntimeError("the payload is damaged:\n  " + "\n  ".join(problems))
    started = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # an unpack cut short is not taken for a complete one next time
    for part in manifest["parts"]:
        if part["name"] not in names:
            continue
        joined = _Joined([payload / p["name"] for p in part["pieces"]])
        whole = hashlib.sha256()

        def read(size: int = -1, joined: _Joined = joined, whole: Any = whole) -> bytes:
            block = joined.read(size)
            whole.update(block)
            return block

        command = _decompressor(manifest["compression"], payload)
        _unpack(read, command, dest)
        if whole.hexdigest() != part["sha256"]:
            raise RuntimeError(f"part {part['name']}: the reassembled stream's SHA-256 differs from the manifest")
        print(f"unpacked {part['name']} ({part['bytes']} bytes, {len(part['pieces'])} pieces)", flush=True)
    stamp.write_text(json.dumps(key))
    return {"parts": names, "seconds": time.perf_counter() - started, "skipped": False}


def library_path(site: Path) -> str:
    """The unpacked tree's ``nvidia/*/lib`` folders, absolute, joined with ``:`` for ``LD_LIBRARY_PATH``.

    TensorFlow dlopens the CUDA libraries from ``libtensorflow_framework.so.2`` (its
    ``tsl::internal::DsoLoader``), and the dynamic loader searches the RUNPATH of the object that
    calls ``dlopen``: that RUNPATH names ``nvidia/{cublas,cuda_cupti,cuda_runtime,cudnn,cufft,
    cusparse,nccl,nvshmem}/lib`` but not ``nvidia/cusolver/lib`` (only ``libtensorflow_cc.so.2``'s
    does), so ``libcusolver.so.11`` is not found, TensorFlow skips the GPU, and the run goes on on
    the CPU (seen on an H200, November 2026). On ``LD_LIBRARY_PATH`` every one of them is found.
    """
    root = site.resolve() / "nvidia"
    return ":".join(str(lib) for lib in sorted(root.glob("*/lib")) if lib.is_dir())


def _unpack(read: Callable[..., bytes], command: list[str] | None, dest: Path) -> None:
    """Feeds ``read`` through the decompressor ``command`` (None: lzma) into a tar extraction at ``dest``."""
    extract_kwargs: dict[str, Any] = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
    if command is None:
        import lzma

        class Reader:
            def read(self, size: int = -1) -> bytes:
                return read(size)

        with lzma.open(Reader()) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
            archive.extractall(dest, members=_safe_members(archive, dest), **extract_kwargs)
        return
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None

    def feed() -> None:
        assert process.stdin is not None
        try:
            for block in iter(lambda: read(MIB), b""):
                process.stdin.write(block)
        except BrokenPipeError:
            pass
        finally:
            process.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
        archive.extractall(dest, members=_safe_members(archive, dest), **extract_kwargs)
    process.stdout.read()
    process.stdout.close()
    feeder.join()
    if process.wait() != 0:
        raise RuntimeError(f"{command[0]} failed with exit status {process.returncode}")


# -- building ------------------------------------------------------------------------------------


def pip_target_flags(python_tag: str) -> list[str]:
    """pip's flags that select the wheels of CPython ``python_tag`` (e.g. ``312``) on manylinux x86-64."""
    flags = [
        "--only-binary=:all:",
        "--python-version",
        python_tag,
        "--implementation",
        "cp",
        "--abi",
        f"cp{python_tag}",
    ]
    for name in PLATFORMS:
        flags += ["--platform", name]
    return flags


def download(python_tag: str, wheels: Path) -> None:
    """``pip download``s TensorFlow with its CUDA 12 libraries, keras and their needs (custom_fit's wheel: ``make``)."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    constraints = ["-c", str(REPO / "constraints.txt")]
    subprocess.run(
        [*pip, "download", "--quiet", *pip_target_flags(python_tag), "--platform", "any", *constraints,
         "-d", str(wheels), TENSORFLOW, "keras"],
        check=True,
    )  # fmt: skip


@dataclass
class Reduction:
    """One way of making the tree smaller, and what it saved."""

    name: str
    why: str
    removed_files: int = 0
    installed_bytes: int = 0  # unpacked size saved
    wheel_bytes: int = 0  # the removed files' compressed size in their wheels (what pip downloads)


def wheel_sizes(wheels: Path) -> dict[str, int]:
    """Installed relative path -> compressed bytes in its wheel (``*.data/purelib|platlib/`` mapped back)."""
    sizes: dict[str, int] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = info.filename
                parts = name.split("/")
                if len(parts) > 2 and parts[0].endswith(".data") and parts[1] in ("purelib", "platlib"):
                    name = "/".join(parts[2:])
                sizes[name] = info.compress_size
    return sizes


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _matches(rel: str, rules: tuple[str, ...]) -> bool:
    """Whether ``rel`` matches a rule: ``dir/`` (prefix), ``*.ext`` (suffix), ``*/name/*`` (a folder anywhere)."""
    for rule in rules:
        if rule.endswith("/") and not rule.startswith("*") and rel.startswith(rule):
            return True
        if rule.startswith("*/") and rule.endswith("/*") and f"/{rule[2:-2]}/" in f"/{rel}":
            return True
        if rule.startswith("*.") and rel.endswith(rule[1:]):
            return True
        if rel == rule:
            return True
    return False


#: (name, why, rules): files removed outright. Rules as in :func:`_matches`.
REMOVALS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("nccl", "NCCL: collectives between GPUs; one GPU never loads it", ("nvidia/nccl/",)),
    (
        "libclang",
        "libclang: TensorFlow's wheel requires it, nothing imports it at run time",
        ("clang/",),
    ),
    ("headers", "C/C++ headers (tensorflow/include, nvidia/*/include)", ("*/include/*", "*.h", "*.hpp", "*.cuh")),
    ("static libraries", "static libraries (*.a)", ("*.a",)),
    (
        "unused CUDA files",
        "files no TensorFlow run loads: cuBLAS' BLAS shim (nvblas), cuFFTW, multi-GPU cuSOLVER (Mg), "
        "NVRTC's alternative build (.alt), CUPTI's profiler extras, NVVM's library (XLA has its own LLVM: "
        "it needs ptxas and libdevice only), NCCL's device code",
        (
            "nvidia/cublas/lib/libnvblas.so.12",
            "nvidia/cufft/lib/libcufftw.so.11",
            "nvidia/cusolver/lib/libcusolverMg.so.11",
            "nvidia/cuda_nvrtc/lib/libnvrtc.alt.so.12",
            "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.alt.so.12.9",
            "nvidia/cuda_cupti/lib/libnvperf_host.so",
            "nvidia/cuda_cupti/lib/libnvperf_target.so",
            "nvidia/cuda_cupti/lib/libpcsamplingutil.so",
            "nvidia/cuda_cupti/lib/libcheckpoint.so",
            "nvidia/cuda_nvcc/nvvm/lib64/",
        ),
    ),
)


def stand_in_source() -> str:
    """The C source of a stand-in library: no symbols, only a SONAME (given at link time)."""
    return "/* A stand-in: TensorFlow dlopens this library at GPU start; a dense/conv run never calls it. */\n"


def build_stand_in(directory: Path, soname: str, work: Path) -> Path:
    """``directory/soname``: an empty shared library whose SONAME is ``soname`` (needs ``cc``)."""
    source = work / "stand_in.c"
    source.write_text(stand_in_source())
    target = directory / soname
    directory.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(target), str(source)], check=True)
    return target


def reduce_tree(
    stage: Path, sizes: dict[str, int], stand_ins: Iterable[str], work: Path
) -> list[Reduction]:  # fmt: skip
    """Applies :data:`REMOVALS` and the stand-ins to ``stage``, measuring each.

    Args:
        stage: The installed tree.
        sizes: :func:`wheel_sizes`.
        stand_ins: Folders under ``nvidia/`` (keys of :data:`STAND_IN_LIBS`) whose libraries
            become stand-ins.
        work: A scratch folder.
    """
    done = []
    for name, why, rules in REMOVALS:
        reduction = Reduction(name, why)
        for path in sorted(stage.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(stage).as_posix()
            if _matches(rel, rules) or (name == "libclang" and rel.startswith("libclang-")):
                reduction.removed_files += 1
                reduction.installed_bytes += path.stat().st_size
                reduction.wheel_bytes += sizes.get(rel, 0)
                path.unlink()
        done.append(reduction)
    for folder in stand_ins:
        soname = STAND_IN_LIBS[folder]
        reduction = Reduction(
            f"stand-in {folder}",
            f"{soname} replaced by an empty library with that SONAME: TensorFlow dlopens it at GPU start, "
            "a dense/conv run never calls it",
        )
        lib = stage / "nvidia" / folder / "lib"
        for path in sorted(lib.glob("*")) if lib.is_dir() else []:
            if path.is_file():
                rel = path.relative_to(stage).as_posix()
                reduction.removed_files += 1
                reduction.installed_bytes += path.stat().st_size
                reduction.wheel_bytes += sizes.get(rel, 0)
                path.unlink()
        stub = build_stand_in(lib, soname, work)
        reduction.installed_bytes -= stub.stat().st_size
        done.append(reduction)
    for path in sorted(stage.rglob("*"), reverse=True):  # folders left empty
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return done


def _tar_members(stage: Path, select: Callable[[str], bool]) -> list[Path]:
    return [
        p
        for p in sorted(stage.rglob("*"))
        if (p.is_file() or p.is_symlink()) and select(p.relative_to(stage).as_posix())
    ]


def compress_command(tool: str, level: int, threads: int) -> list[str]:
    """The command that compresses stdin to stdout."""
    if tool == "zstd":
        return ["zstd", "-c", "-q", f"-{level}", f"-T{threads}", "--long=27"] + (["--ultra"] if level > 19 else [])
    if tool == "xz":
        return ["xz", "-c", f"-{level}", f"-T{threads}"]
    if tool == "none":
        return ["cat"]
    raise ValueError(f"unknown compression {tool!r}")


def write_part(
    stage: Path, name: str, select: Callable[[str], bool], out: Path, command: list[str], piece_bytes: int
) -> dict[str, Any]:  # fmt: skip
    """Tars the selected files of ``stage``, compresses and splits them into ``out/<name>.tar.<ext>.NNN``."""
    members = _tar_members(stage, select)
    process = subprocess.Popen(["nice", "-n", "19", *command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    tar_bytes = sum(p.stat().st_size for p in members if p.is_file())

    def feed() -> None:
        assert process.stdin is not None
        with tarfile.open(fileobj=process.stdin, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            for path in members:
                info = archive.gettarinfo(str(path), arcname=path.relative_to(stage).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        archive.addfile(info, f)
                else:
                    archive.addfile(info)
        process.stdin.close()

    started = time.perf_counter()
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    ext = {"zstd": "zst", "xz": "xz", "none": "raw"}.get(command[0], command[0])
    result = split_stream(process.stdout, out, f"{name}.tar.{ext}", piece_bytes)
    process.stdout.close()
    feeder.join()
    if process.wait() != 0:
        raise RuntimeError(f"{command[0]} failed with exit status {process.returncode}")
    return {
        "name": name,
        "files": len(members),
        "tar_bytes": tar_bytes,
        "compress_seconds": round(time.perf_counter() - started, 1),
        **result,
    }


def build(args: argparse.Namespace) -> dict[str, Any]:
    """``build``: see the module docstring. Returns the manifest it wrote."""
    wheels, out = args.wheels, args.out
    stage = args.stage
    if stage.exists():
        shutil.rmtree(stage)
    pip_install = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--no-index", "--no-compile"]
    pip_install += ["--find-links", str(wheels), "--target", str(stage), *pip_target_flags(args.python_tag)]
    subprocess.run([*pip_install, TENSORFLOW, "keras", "custom_fit"], check=True)
    sizes = wheel_sizes(wheels)
    downloaded = {w.name: w.stat().st_size for w in sorted(wheels.glob("*.whl"))}
    installed = tree_bytes(stage)
    with tempfile.TemporaryDirectory() as work:
        reductions = reduce_tree(stage, sizes, args.stand_ins, Path(work))
    for reduction in reductions:
        print(
            f"{reduction.name}: -{reduction.installed_bytes / MIB:,.0f} MiB installed, "
            f"-{reduction.wheel_bytes / MIB:,.0f} MiB as wheels ({reduction.removed_files} files)",
            flush=True,
        )
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    command = compress_command(args.compress, args.level, args.threads)

    def in_cudnn(rel: str) -> bool:
        return rel.startswith(CUDNN_PREFIXES)

    parts = [write_part(stage, "core", lambda rel: not in_cudnn(rel), out, command, args.piece_bytes)]
    if args.cudnn == "carry":
        parts.append(write_part(stage, "cudnn", in_cudnn, out, command, args.piece_bytes))
    tools = []
    zstd = shutil.which("zstd")
    if args.compress == "zstd" and zstd:  # for an image without zstd (statically linked libzstd here)
        shutil.copy(zstd, out / "zstd")
        tools.append({"name": "zstd", "bytes": (out / "zstd").stat().st_size, "sha256": sha256_file(out / "zstd")})
    manifest = {
        "format": FORMAT,
        "python_tag": f"cp{args.python_tag}",
        "platforms": list(PLATFORMS),
        "requirements": [TENSORFLOW, "keras", "custom_fit"],
        "built_on": f"{platform.node()}, Python {platform.python_version()}",
        "compression": {"tool": args.compress, "level": args.level, "threads": args.threads, "command": command},
        "piece_bytes": args.piece_bytes,
        "options": {"cudnn": args.cudnn, "stand_ins": list(args.stand_ins)},
        "downloaded": {"wheels": downloaded, "bytes": sum(downloaded.values())},
        "installed_bytes": installed,
        "reductions": [vars(r) for r in reductions],
        "reduced_bytes": tree_bytes(stage),
        "parts": parts,
        "tools": tools,
        "total_bytes": sum(p["bytes"] for p in parts),
        "pieces": sum(len(p["pieces"]) for p in parts),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(report(manifest))
    return manifest


def report(manifest: dict[str, Any]) -> str:
    """What the payload weighs, as Markdown (docs/performance.md quotes it)."""
    lines = [
        f"Payload for {manifest['python_tag']} ({manifest['compression']['tool']} "
        f"-{manifest['compression']['level']}; cuDNN: {manifest['options']['cudnn']}; stand-ins: "
        f"{', '.join(manifest['options']['stand_ins']) or 'none'}):",
        "",
        f"- downloaded wheels: {manifest['downloaded']['bytes'] / MIB:,.0f} MiB; installed: "
        f"{manifest['installed_bytes'] / MIB:,.0f} MiB; after the reductions: "
        f"{manifest['reduced_bytes'] / MIB:,.0f} MiB",
        "",
        "| reduction | files | saved, installed (MiB) | saved, as wheels (MiB) |",
        "|---|---:|---:|---:|",
    ]
    for r in manifest["reductions"]:
        lines.append(
            f"| {r['name']} | {r['removed_files']} | {r['installed_bytes'] / MIB:,.0f} | "
            f"{r['wheel_bytes'] / MIB:,.0f} |"
        )
    lines += ["", "| part | files | tar (MiB) | compressed (MiB) | ratio | pieces | seconds to compress |"]
    lines += ["|---|---:|---:|---:|---:|---:|---:|"]
    for p in manifest["parts"]:
        lines.append(
            f"| {p['name']} | {p['files']} | {p['tar_bytes'] / MIB:,.0f} | {p['bytes'] / MIB:,.1f} | "
            f"{p['bytes'] / max(p['tar_bytes'], 1):.3f} | {len(p['pieces'])} | {p['compress_seconds']} |"
        )
    lines.append(
        f"| all | | | {manifest['total_bytes'] / MIB:,.1f} ({manifest['total_bytes'] / 1e9:.2f} GB) | | "
        f"{manifest['pieces']} | |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="pip download the wheels for one Python tag")
    down.add_argument("--python-tag", default="312", help="CPython tag without dots (default 312: the device's)")
    down.add_argument("--wheels", type=Path, required=True)
    make = sub.add_parser("build", help="installed tree -> reductions -> pieces + manifest")
    make.add_argument("--python-tag", default="312")
    make.add_argument("--wheels", type=Path, required=True)
    make.add_argument("--stage", type=Path, required=True, help="where the tree is installed (replaced)")
    make.add_argument("--out", type=Path, required=True, help="where the pieces go (replaced)")
    make.add_argument("--cudnn", choices=("carry", "image"), default="carry")
    make.add_argument("--stand-ins", nargs="*", default=list(STAND_IN_LIBS), choices=list(STAND_IN_LIBS), metavar="LIB")
    make.add_argument("--compress", choices=("zstd", "xz", "none"), default="zstd")
    make.add_argument("--level", type=int, default=12)
    make.add_argument("--threads", type=int, default=2)
    make.add_argument("--piece-bytes", type=int, default=PIECE_BYTES)
    check = sub.add_parser("verify", help="check every piece against the manifest")
    check.add_argument("payload", type=Path)
    check.add_argument("--parts", nargs="*")
    put = sub.add_parser("install", help="verify, reassemble and unpack into a directory")
    put.add_argument("payload", type=Path)
    put.add_argument("dest", type=Path)
    put.add_argument("--parts", nargs="*", help="default: every part whose pieces are all present")
    show = sub.add_parser("report", help="the manifest's sizes as Markdown")
    show.add_argument("payload", type=Path)
    libs = sub.add_parser("library-path", help="the unpacked tree's nvidia/*/lib folders, for LD_LIBRARY_PATH")
    libs.add_argument("site", type=Path)
    args = parser.parse_args(argv)
    if args.command == "download":
        download(args.python_tag, args.wheels)
    elif args.command == "build":
        build(args)
    elif args.command == "verify":
        problems = verify(args.payload, args.parts)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    elif args.command == "install":
        result = install(args.payload, args.dest, args.parts)
        print(json.dumps(result))
    elif args.command == "report":
        print(report(read_manifest(args.payload)), end="")
    elif args.command == "library-path":
        print(library_path(args.site))
    return 0


if __name__ == "__main__":
    sys.exit(main())
