# The set-up both device scripts share (sourced by gpu_check.sh and
# gpu_cross_device.sh, from the repository root): the wheels of what the machine
# lacks (.whl/, installed into /tmp/site unless NO_WHEELS=1), the Fashion-MNIST files
# (.fmnist/), the kernels package link, the machine's description in $O/machine.txt,
# and step NAME SECONDS COMMAND...: its output in $O/NAME.log, its tail printed, its exit
# status returned (FAILED counts the steps that failed).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/tmp/gpu_out}; mkdir -p "$O"
PY=${PY:-python3}
if [ "${NO_WHEELS:-0}" != 1 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export FEDJAX_DP_DATA=$PWD/.fmnist
# not installed: fedjax_dp.kernels is the top-level kernels/ (pyproject's package-dir)
[ -e fedjax_dp/kernels ] || ln -s ../kernels fedjax_dp/kernels
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  nproc; } | tee "$O/machine.txt"

FAILED=0   # steps that did not exit 0 (a script may end with: exit $((FAILED > 0)))
step() {
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit} s) $(date +%T)"
  local t=$SECONDS rc
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t)) s"
  tail -n "${TAIL:-14}" "$O/$name.log"
  [ "$rc" = 0 ] || FAILED=$((FAILED + 1))
  return "$rc"
}
