#!/bin/bash
# Every script of examples/python run as its docstring says, against a fresh broker, with the
# package from the source tree: share.py, weights.py and ring.py on memfd (NumPy), ring.py again
# for each framework this Python has (torch and JAX on host memory), and, where CUDA works
# (torch.cuda.is_available()), the --cuda variants (CuPy's ring among them). Each script checks
# its own results and exits non-zero when they are wrong. What is missing is named, not run.
#   test-examples.sh PYTHON
set -uo pipefail
python=${1:?usage: test-examples.sh PYTHON}
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
dir=$(mktemp -d /tmp/gpuipc-examples.XXXXXX)
export GPUIPC_SOCKET=$dir/s.sock GPUIPC_LIBRARY=$build/client/libgpuipc.so PYTHONPATH=$root/python
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --seccomp "${GPUIPC_TEST_SECCOMP:-enforce}" --log-level warn 2>"$dir/broker.log" &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$dir"' EXIT
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null || { echo "the broker did not start"; exit 1; }
has() { "$python" -c "import $1" 2>/dev/null; }
failures=0 ran=0
run() {
        echo "--- python3 examples/python/$*"
        if (cd "$dir" && timeout 120 "$python" "$root/examples/python/$@"); then
                ran=$((ran + 1))
        else
                echo "FAIL examples/python/$*"
                failures=$((failures + 1))
        fi
}
cuda=no
has torch && "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && cuda=yes

run share.py
run weights.py
run ring.py
for fw in torch jax; do
        if has $fw; then run ring.py --framework $fw; else echo "skip ring.py --framework $fw: no $fw in this Python"; fi
done
if [[ $cuda == yes ]]; then
        run share.py --cuda
        run weights.py --cuda
        run ring.py --framework torch --cuda
        if has cupy; then run ring.py --framework cupy --cuda; else echo "skip ring.py --framework cupy --cuda: no cupy"; fi
else
        echo "skip the --cuda variants: no GPU that torch can use here"
fi
echo "$ran examples ran, $failures failed"
[[ $failures == 0 ]] || { echo "--- broker log"; cat "$dir/broker.log"; exit 1; }
