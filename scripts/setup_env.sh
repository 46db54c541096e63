#!/usr/bin/env bash
# Creates .venv with the pinned stack and a Horovod 0.28.1 built with PyTorch, TensorFlow and Gloo.
# Idempotent: a stamp file records a finished set-up; the Horovod wheel is cached outside the
# checkout (keyed by Python, torch and TF versions) so later runs and CI reuse it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv="$here/.venv"
py=${PYTHON:-python3}
torch_v=2.13.0
tf_v=2.21.0
hvd_v=0.28.1
stamp="$venv/.deepreduce-setup-$torch_v-cpu$tf_v-$hvd_v"
cache=${DEEPREDUCE_WHEEL_CACHE:-$HOME/.cache/deepreduce-hvd/wheels}

if [ -f "$stamp" ]; then
    "$venv/bin/pip" install -q --no-build-isolation --no-deps -e "$here"
    exit 0
fi
# a venv without the stamp is a failed or older set-up: start again (the wheels are cached)
rm -rf "$venv"
"$py" -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip wheel setuptools
"$pip" install -q "torch==$torch_v" "tensorflow-cpu==$tf_v" cloudpickle psutil pyyaml packaging
# tf-keras asks for the `tensorflow` distribution, whose files (a build with CUDA stubs) would
# overwrite tensorflow-cpu's and log CUDA start-up lines that no environment variable silences
"$pip" install -q --no-deps "tf-keras==$tf_v"

pyver=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key="py-$pyver-torch-$torch_v-tf-$tf_v"
whl_dir="$cache/horovod-$hvd_v-$key"
if ! ls "$whl_dir"/horovod-*.whl >/dev/null 2>&1; then
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # Horovod forces -std=c++14 but torch >= 2.1 headers need C++17, and its optional XLA op
    # includes TensorFlow headers that TF 2.21 no longer ships: one compiler wrapper fixes both.
    : > "$build/empty.cc"
    cat > "$build/cxx" <<WRAP
#!/usr/bin/env bash
args=()
for a in "\$@"; do
    case "\$a" in
        -std=c++11|-std=c++14) args+=(-std=c++17) ;;
        *xla_mpi_ops.cc) args+=("$build/empty.cc") ;;
        *) args+=("\$a") ;;
    esac
done
exec g++ "\${args[@]}"
WRAP
    chmod +x "$build/cxx"
    export PATH="$venv/bin:$PATH"
    CXX="$build/cxx" CC=gcc HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
        "$pip" wheel --no-build-isolation --no-deps --no-binary horovod -w "$build/out" "horovod==$hvd_v"
    mkdir -p "$whl_dir"
    cp "$build"/out/horovod-*.whl "$whl_dir/"
fi
"$pip" install -q --no-deps "$whl_dir"/horovod-*.whl
TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=0 "$venv/bin/horovodrun" --check-build | tee "$venv/check-build.txt"
for fw in PyTorch TensorFlow Gloo; do
    grep -E "\[X\] $fw" "$venv/check-build.txt" >/dev/null || { echo "horovod lacks $fw" >&2; exit 1; }
done
# the rest of the stack (benchmarks, jobs, tests) comes from the package's extras
"$pip" install -q --no-build-isolation -e "$here[bench,jobs,test]"
touch "$stamp"
