#!/usr/bin/env bash
# The GPU table on the lent GPU machine (issue 44), from the payload of `make gpu-payload`.
#
#   benchmarks/gpu/run.sh [--dry-run] [--payload DIR] [--site DIR] [--out DIR] [--cudnn auto|payload|image]
#                         [--only "cnn resnet mlp gan"] [--cap SECONDS] [--max-seconds SECONDS] [--no-parity]
#
# 1. checks every piece of the payload against its manifest (SHA-256), reassembles and unpacks
#    it into DIR (default .gpu-payload/site: ignored, so a warm machine keeps it between calls;
#    an unchanged payload is not unpacked twice);
# 2. cuDNN: the payload's part `cudnn` where its pieces are there, else (auto, image) the image's
#    own libcudnn*.so.9, linked into the tree where TensorFlow looks (nvidia/cudnn/lib); switching
#    between the two on a warm machine replaces the one left there;
#    then every nvidia/*/lib of the tree goes on LD_LIBRARY_PATH (TensorFlow's RUNPATH misses cuSOLVER's);
# 3. prints tf.config.list_physical_devices("GPU");
# 4. runs each workload of benchmarks/gpu/gpu_bench.py in its own process, capped by `timeout`,
#    with nvidia-smi logging utilization, then the parity check, and writes to OUT ($OUT, else
#    benchmarks/results/gpu): gpu.json, gpu.md, gpu.png, parity.json, nvidia-smi.csv, run.log.
#
# --dry-run (CPU): steps 1-3, then one tiny training step on the CPU from the unpacked tree.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
payload=.gpu-payload/py312/payload
site=.gpu-payload/site
out=${OUT:-$repo/benchmarks/results/gpu}
cudnn=auto
only="cnn resnet mlp gan"
cap=150          # seconds per workload, tracing and warm-up included (timeout kills past it)
max_seconds=60   # measuring time per workload (gpu_bench.py's stop rule)
dry_run=0
parity=1
python=${PYTHON:-python3}

while (($#)); do
    case $1 in
        --dry-run) dry_run=1 ;;
        --payload) payload=$2; shift ;;
        --site) site=$2; shift ;;
        --out) out=$2; shift ;;
        --cudnn) cudnn=$2; shift ;;
        --only) only=$2; shift ;;
        --cap) cap=$2; shift ;;
        --max-seconds) max_seconds=$2; shift ;;
        --no-parity) parity=0 ;;
        --python) python=$2; shift ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case $cudnn in auto | payload | image) ;; *) echo "run.sh: --cudnn auto|payload|image" >&2; exit 2 ;; esac
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
echo "run.sh: $(date -u +%FT%TZ) payload=$payload site=$site out=$out cudnn=$cudnn dry_run=$dry_run"

# 1. Verify and unpack. Without --parts, install takes every part whose pieces are all present.
parts=(core)
if [[ $cudnn != image ]] && "$python" benchmarks/gpu/payload.py verify "$payload" --parts cudnn >/dev/null 2>&1; then
    parts+=(cudnn)
elif [[ $cudnn == payload ]]; then
    echo "run.sh: --cudnn payload, but the payload's cudnn pieces are missing or damaged" >&2
    "$python" benchmarks/gpu/payload.py verify "$payload" --parts cudnn || true
    exit 1
fi
"$python" benchmarks/gpu/payload.py verify "$payload" --parts core
# A run with the image's cuDNN (--cudnn image, or auto without the part) left links to the image's
# libcudnn*.so.9 in nvidia/cudnn/lib: the payload's cuDNN replaces them. Removing the stamp makes
# install unpack again, as the links took the place of the part's files.
if [[ " ${parts[*]} " == *" cudnn "* && -d $site/nvidia/cudnn/lib ]] &&
    [[ -n $(find "$site/nvidia/cudnn/lib" -maxdepth 1 -type l -print -quit) ]]; then
    echo "run.sh: removing the image's cuDNN links from $site/nvidia/cudnn/lib"
    find "$site/nvidia/cudnn/lib" -maxdepth 1 -type l -delete
    rm -f "$site/.payload.json"
fi
started=$(date +%s)
"$python" benchmarks/gpu/payload.py install "$payload" "$site" --parts "${parts[@]}"
echo "run.sh: unpacked ${parts[*]} in $(($(date +%s) - started)) s; $(du -sh "$site" | cut -f1) on disk"

# 2. cuDNN from the image, when the payload's is not used.
if [[ ! " ${parts[*]} " == *" cudnn "* ]] && ((!dry_run)); then
    found=$("$python" - <<'EOF' || true
import glob, os
roots = ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", "/opt", "/usr/local/lib"]
hits = [p for r in roots for p in glob.glob(os.path.join(r, "**", "libcudnn.so.9*"), recursive=True)]
print(os.path.dirname(sorted(hits, key=len)[0]) if hits else "")
EOF
)
    if [[ -z $found ]]; then
        echo "run.sh: no libcudnn.so.9 in the image and no cudnn part: TensorFlow will not use the GPU" >&2
    else
        echo "run.sh: cuDNN from the image: $found"
        # Only links to the image's cuDNN in nvidia/cudnn/lib: whatever is there (the payload's cuDNN
        # from an earlier --cudnn payload run, old links) goes, so the two are never mixed. The stamp
        # that install just wrote names the core part alone, so a later run with the part unpacks it.
        rm -rf "$site/nvidia/cudnn/lib"
        mkdir -p "$site/nvidia/cudnn/lib"
        for lib in "$found"/libcudnn*.so.9*; do ln -s "$lib" "$site/nvidia/cudnn/lib/"; done
        # cuDNN for CUDA 13 loads cuBLAS(Lt) 13 and NVRTC 13: those libraries alone (SONAMEs .so.13, no
        # clash with the CUDA 12 ones TensorFlow asks for) from the pip layout beside it, if there.
        mkdir -p "$site/cuda13"
        for lib in "$found"/../../{cublas,cuda_nvrtc,cu13}/lib/lib{cublas,cublasLt,nvrtc}*.so.13*; do
            [[ -e $lib ]] && ln -sf "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")" "$site/cuda13/"
        done
        LD_LIBRARY_PATH=$(cd "$site/cuda13" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LD_LIBRARY_PATH
    fi
fi

# The tree goes first on the path; the image's packages (scikit-learn, matplotlib) stay visible.
site_abs=$(cd "$site" && pwd)
# Every nvidia/*/lib of the tree on LD_LIBRARY_PATH, before TensorFlow is imported: TensorFlow
# dlopens the CUDA libraries from libtensorflow_framework.so.2, whose RUNPATH has no
# nvidia/cusolver/lib (libtensorflow_cc.so.2's has, but the loader searches the caller's), so
# without this libcusolver.so.11 is not found and TensorFlow skips the GPU and runs on the CPU.
libs=$("$python" benchmarks/gpu/payload.py library-path "$site_abs")
if [[ -n $libs ]]; then  # an empty entry would mean the working directory
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "run.sh: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
export PYTHONPATH=$site_abs:$repo${PYTHONPATH:+:$PYTHONPATH}
export PATH=$site_abs/nvidia/cuda_nvcc/bin:$PATH                                      # ptxas, for XLA
export XLA_FLAGS="--xla_gpu_cuda_data_dir=$site_abs/nvidia/cuda_nvcc ${XLA_FLAGS:-}"  # libdevice
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
export PYTHONUNBUFFERED=1

# 3. What TensorFlow sees.
"$python" - <<'EOF' | tee "$out/devices.txt"
import tensorflow as tf, keras, custom_fit, numpy
print("tensorflow", tf.__version__, tf.__file__)
print("keras", keras.__version__, "custom_fit", custom_fit.__version__, custom_fit.__file__, "numpy", numpy.__version__)
print("built with CUDA:", tf.test.is_built_with_cuda(), tf.sysconfig.get_build_info().get("cuda_version"),
      "cuDNN", tf.sysconfig.get_build_info().get("cudnn_version"))
print("GPU:", tf.config.list_physical_devices("GPU"))
EOF

if ((dry_run)); then
    "$python" - <<'EOF'
import time
import numpy as np
from benchmarks import bench
import custom_fit
started = time.perf_counter()
model = bench.small_mlp(custom_fit.CustomModel)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
history = model.fit(rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 10, 64), batch_size=32, verbose=0)
print(f"dry run: one epoch of 2 steps on the CPU, loss {history.history['loss'][0]:.4f}, "
      f"{time.perf_counter() - started:.1f} s")
EOF
    echo "run.sh: dry run passed"
    exit 0
fi

# 4. The table, one capped process per workload, with nvidia-smi logging.
parts_dir=$(mktemp -d)
smi_pid=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L || true
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used --format=csv,noheader,nounits \
        -lms 250 >"$out/nvidia-smi.csv" 2>/dev/null &
    smi_pid=$!
fi
for key in $only; do
    started=$(date +%s)
    status=0
    timeout --kill-after=10 "$cap" "$python" benchmarks/gpu/gpu_bench.py --only "$key" --out "$parts_dir" \
        --max-seconds "$max_seconds" || status=$?
    echo "run.sh: workload $key: exit $status in $(($(date +%s) - started)) s (cap $cap s)"  # no bc on the device
done
if ((parity)); then
    status=0
    timeout --kill-after=10 "$cap" "$python" benchmarks/gpu/parity.py --out "$out" || status=$?
    echo "run.sh: parity: exit $status"
fi
[[ -n $smi_pid ]] && kill "$smi_pid" 2>/dev/null || true
smi_args=()
[[ -s $out/nvidia-smi.csv ]] && smi_args=(--smi-csv "$out/nvidia-smi.csv")
"$python" benchmarks/gpu/gpu_bench.py --merge "$parts_dir" --out "$out" "${smi_args[@]}"
rm -rf "$parts_dir"
echo "run.sh: done: $(ls "$out")"
