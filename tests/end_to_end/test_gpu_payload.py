"""benchmarks/gpu/payload.py on a small fake payload: split, manifest, verify, reassemble, unpack.

No download and no TensorFlow: the real payload (`make gpu-payload`) is never built in CI.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks.gpu import payload as pl

RUN_SH = pl.REPO / "benchmarks/gpu/run.sh"


def fake_tree(root):
    """A tree shaped like the real one: a core file, a cuDNN file, a header and a static library."""
    files = {
        "tensorflow/__init__.py": b"version = '0'\n",
        "tensorflow/libfake.so.2": bytes(range(256)) * 900,  # 230 kB, cut into several pieces
        "nvidia/cudnn/lib/libcudnn.so.9": b"cudnn" * 5000,
        "nvidia/cuda_nvrtc/lib/libnvrtc.so.12": b"nvrtc" * 100,
        "nvidia/cublas/include/cublas.h": b"/* header */\n",
        "nvidia/cuda_runtime/lib/libcudart_static.a": b"!<arch>\n",
        "nvidia/nccl/lib/libnccl.so.2": b"nccl" * 100,
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def build_fake(tmp_path, compress="none", piece_bytes=64 * 1024):
    stage, out = tmp_path / "stage", tmp_path / "payload"
    files = fake_tree(stage)
    command = pl.compress_command(compress, 1, 1)
    parts = [
        pl.write_part(stage, "core", lambda rel: not rel.startswith(pl.CUDNN_PREFIXES), out, command, piece_bytes),
        pl.write_part(stage, "cudnn", lambda rel: rel.startswith(pl.CUDNN_PREFIXES), out, command, piece_bytes),
    ]
    manifest = {"format": pl.FORMAT, "compression": {"tool": compress}, "parts": parts, "tools": []}
    (out / pl.MANIFEST).write_text(json.dumps(manifest))
    return files, out, manifest


def test_split_stream_cuts_at_the_limit_and_hashes(tmp_path):
    data = bytes(range(256)) * 40  # 10,240 bytes: pieces of 4,096, 4,096 and 2,048
    result = pl.split_stream(io.BytesIO(data), tmp_path, "x", piece_bytes=4096)
    assert [p["bytes"] for p in result["pieces"]] == [4096, 4096, 2048]
    assert b"".join((tmp_path / p["name"]).read_bytes() for p in result["pieces"]) == data
    exact = pl.split_stream(io.BytesIO(data[:8192]), tmp_path / "exact", "x", piece_bytes=4096)
    assert [p["bytes"] for p in exact["pieces"]] == [4096, 4096]  # no empty third piece
    assert not (tmp_path / "exact" / "x.002").exists()


@pytest.mark.parametrize("compress", ["none", "xz"])
def test_pieces_verify_reassemble_and_unpack_to_the_same_files(tmp_path, compress):
    if compress != "none" and not shutil.which(compress):
        pytest.skip(f"no {compress} here")
    files, out, manifest = build_fake(tmp_path, compress)
    core = manifest["parts"][0]
    assert len(core["pieces"]) >= 2 or compress != "none"  # the fake core spans pieces uncompressed
    assert all(p["bytes"] <= 64 * 1024 for part in manifest["parts"] for p in part["pieces"])
    assert pl.verify(out, quiet=True) == []
    assert pl.present_parts(out) == ["core", "cudnn"]
    result = pl.install(out, tmp_path / "site")
    assert result["parts"] == ["core", "cudnn"] and not result["skipped"]
    for rel, data in files.items():
        assert (tmp_path / "site" / rel).read_bytes() == data
    assert pl.install(out, tmp_path / "site")["skipped"]  # same payload, same parts: not unpacked again


def test_damaged_or_missing_pieces_are_named_and_refused(tmp_path):
    _, out, manifest = build_fake(tmp_path)
    first = manifest["parts"][0]["pieces"][0]["name"]
    damaged = bytearray((out / first).read_bytes())
    damaged[100] ^= 0xFF
    (out / first).write_bytes(bytes(damaged))
    (out / manifest["parts"][1]["pieces"][0]["name"]).unlink()
    problems = pl.verify(out, quiet=True)
    assert problems == [
        f"{first}: SHA-256 differs from the manifest",
        f"{manifest['parts'][1]['pieces'][0]['name']}: missing",
    ]
    assert pl.present_parts(out) == ["core"]  # cudnn incomplete: left out; core's sizes still match
    with pytest.raises(RuntimeError, match="damaged"):
        pl.install(out, tmp_path / "site")


def test_core_alone_installs_without_the_cudnn_part(tmp_path):
    _, out, manifest = build_fake(tmp_path)
    for piece in manifest["parts"][1]["pieces"]:
        (out / piece["name"]).unlink()
    assert pl.install(out, tmp_path / "site")["parts"] == ["core"]
    assert (tmp_path / "site/tensorflow/libfake.so.2").is_file()
    assert not (tmp_path / "site/nvidia/cudnn").exists()


def test_removal_rules_measure_what_they_remove(tmp_path):
    stage = tmp_path / "stage"
    fake_tree(stage)
    sizes = {"nvidia/nccl/lib/libnccl.so.2": 123}
    reductions = {r.name: r for r in pl.reduce_tree(stage, sizes, [], tmp_path)}
    assert reductions["nccl"].removed_files == 1 and reductions["nccl"].wheel_bytes == 123
    assert reductions["nccl"].installed_bytes == 400
    assert reductions["headers"].removed_files == 1 and reductions["static libraries"].removed_files == 1
    assert not (stage / "nvidia/nccl").exists() and not (stage / "nvidia/cublas").exists()
    assert (stage / "nvidia/cudnn/lib/libcudnn.so.9").is_file()


@pytest.mark.skipif(not shutil.which("cc") or not shutil.which("readelf"), reason="needs cc and readelf")
def test_stand_in_has_the_soname_and_loads(tmp_path):
    stub = pl.build_stand_in(tmp_path / "lib", "libcufft.so.11", tmp_path)
    dynamic = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcufft.so.11]" in dynamic
    ctypes.CDLL(str(stub))  # dlopen succeeds, as TensorFlow's check at GPU start needs
    assert stub.stat().st_size < 20_000


def test_install_replaces_a_link_left_at_a_files_path_and_spares_its_target(tmp_path):
    _, out, _ = build_fake(tmp_path)
    image = tmp_path / "image/libcudnn.so.9.14.0"  # run.sh --cudnn image linked the image's cuDNN here
    image.parent.mkdir()
    image.write_bytes(b"the image's cuDNN")
    lib = tmp_path / "site/nvidia/cudnn/lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9").symlink_to(image)
    assert pl.install(out, tmp_path / "site")["parts"] == ["core", "cudnn"]
    assert not (lib / "libcudnn.so.9").is_symlink()
    assert (lib / "libcudnn.so.9").read_bytes() == b"cudnn" * 5000
    assert image.read_bytes() == b"the image's cuDNN"


def test_library_path_lists_the_trees_lib_folders(tmp_path):
    _, out, _ = build_fake(tmp_path)
    site = tmp_path / "site"
    assert pl.library_path(site) == ""  # nothing unpacked: nothing to add
    pl.install(out, site)
    (site / "nvidia/cublas/lib").write_text("a file, not a folder")
    expected = [site.resolve() / f"nvidia/{name}/lib" for name in ("cuda_nvrtc", "cuda_runtime", "cudnn", "nccl")]
    assert pl.library_path(site) == ":".join(map(str, expected))


def fake_python(tmp_path, image_cudnn):
    """A ``--python`` for run.sh: payload.py runs for real; TensorFlow's steps print the environment."""
    script = tmp_path / "python"
    script.write_text(
        f"""#!/usr/bin/env bash
if [[ $1 == - ]]; then
    case $(cat) in
        *libcudnn.so.9*) echo "{image_cudnn}" ;;  # run.sh's search for the image's cuDNN
        *) echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" ;;  # the TensorFlow steps
    esac
elif [[ $1 == benchmarks/gpu/payload.py ]]; then
    exec {sys.executable} "$@"
fi
"""
    )
    script.chmod(0o755)
    return script


@pytest.mark.skipif(
    not shutil.which("bash") or not shutil.which("timeout"),
    reason="runs benchmarks/gpu/run.sh, a bash script that caps each workload with coreutils' timeout "
    "(both are on every Linux machine CI and the GPU run use; absent on e.g. Windows without a Unix toolset)",
)
def test_run_sh_switches_between_the_images_cudnn_and_the_payloads(tmp_path):
    _, out, _ = build_fake(tmp_path)
    image = tmp_path / "image/lib"
    image.mkdir(parents=True)
    (image / "libcudnn.so.9.14.0").write_bytes(b"the image's cuDNN")
    (image / "libcudnn.so.9").symlink_to("libcudnn.so.9.14.0")
    python, site, lib = fake_python(tmp_path, image), tmp_path / "site", tmp_path / "site/nvidia/cudnn/lib"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}

    def run(*args):
        command = ["bash", str(RUN_SH), "--payload", str(out), "--site", str(site), "--out", str(tmp_path / "out")]
        command += ["--python", str(python), *args]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return (tmp_path / "out/devices.txt").read_text()

    payload_cudnn = {"libcudnn.so.9"}
    devices = run("--dry-run", "--cudnn", "payload")
    assert f"{site.resolve()}/nvidia/cudnn/lib" in devices and f"{site.resolve()}/nvidia/cuda_runtime/lib" in devices
    assert {p.name for p in lib.iterdir()} == payload_cudnn and not (lib / "libcudnn.so.9").is_symlink()

    run("--cudnn", "image", "--only", "", "--no-parity")  # the payload's cuDNN files give way to links
    assert {p.name for p in lib.iterdir()} == {"libcudnn.so.9", "libcudnn.so.9.14.0"}
    assert all(p.is_symlink() for p in lib.iterdir())
    assert (image / "libcudnn.so.9.14.0").read_bytes() == b"the image's cuDNN"

    run("--dry-run", "--cudnn", "payload")  # and back: the links go, the part is unpacked again
    assert {p.name for p in lib.iterdir()} == payload_cudnn
    assert (lib / "libcudnn.so.9").read_bytes() == b"cudnn" * 5000
    assert (image / "libcudnn.so.9.14.0").read_bytes() == b"the image's cuDNN"
