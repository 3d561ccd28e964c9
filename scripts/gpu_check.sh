#!/usr/bin/env bash
# relax-gym's GPU check: one script, one GPU machine (an H200), no internet, under 8 minutes (BUDGET_S, 460 s, is
# shared by the steps, install included; a step is killed 15 s after its cap at the latest, so the script ends
# within 460 + 15 s and a summary).
#
#   scripts/gpu_check.sh [--wheelhouse DIR] [--out DIR] [--steps N]   # GPU: offline install, then the checks
#   scripts/gpu_check.sh --dry-run [--out DIR] [--wheelhouse DIR]      # the same checks on CPU (gloo for nccl)
#
# The machine has torch, transformers and triton; sglang is not there, so the SGLang engine is not checked here.
# Before going offline, fill a wheelhouse with scripts/gpu_wheelhouse.sh (megatron-core, pydantic, httpx, av, ...;
# default DIR: wheelhouse/ at the repository root). The install step puts those wheels and relax-gym, built from
# this checkout with the wheelhouse's hatchling, into OUT/site (pip --target --no-deps: nothing on the machine is
# changed) and the checks import relax-gym from there. A dry run skips the install unless --wheelhouse is given and
# imports the checkout. PYTHON picks the interpreter (default: python3).
#
# Checks (one JSON line each in OUT/gpu_check.jsonl; logs in OUT/<check>.log):
#   env       interpreter, torch / CUDA / GPU, transformers, triton, megatron-core versions
#   install   the offline install (GPU run, or a dry run with --wheelhouse)
#   megatron  python -m relax_gym.trainer.tools.megatron_check --device cuda --steps N: HF vs Megatron token
#             log-probs (fp32, max abs diff <= 1e-4), bit-exact HF <-> Megatron conversion, N training steps
#   megatron_group  python -m relax_gym.trainer.tools.megatron_check --device cuda --group: the rank-group launcher
#             (Ray placement group, one rank process, nccl) at world size 1 against the in-process actor: bit-identical
#             gathered weights, one RL step within 1e-4 (needs Ray on the machine; fails with the reason if absent)
#   dcs       python -m relax_gym.trainer.tools.transport_check --device cuda: a DCS push over nccl between two
#             processes (two pushes, SHA-256 per tensor equal), and our weight-update group meeting an end built
#             the way SGLang builds its own
#   models    python -m relax_gym.trainer.tools.model_check --device cuda $MODEL_CHECK_ARGS: a full-depth
#             Qwen2.5-Omni-3B stand-in (36 layers, ~13.9 GB written under OUT/models and removed after) through the
#             directory check, build_policy in bf16 on the GPU, logits of our render vs transformers' processor
#             (fp32, <= 1e-4), HF -> Megatron -> HF bit-exact, one training step, save + reload bit-identical; the
#             tool's own budget is the step's cap minus 25 s, so it stops its parts and reports before the kill.
#             MODEL_CHECK_ARGS (word-split) replaces the default extra arguments: none on a GPU (full depth, every
#             parameter trained), "--layers 1 --freeze-vocab" in a dry run (a 1-layer stand-in; the embedding and
#             head not trained, which keeps the CPU process under ~4.5 GB); e.g. MODEL_CHECK_ARGS="--standin DIR"
#             checks an existing stand-in (or a real checkpoint) instead of writing one
#   summary   every check's ok and the wall time; OUT/gpu-results.md holds the same as a table
# Exit status: 0 when every check passed, 1 otherwise, 2 for bad arguments.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
DRY_RUN=0
WHEELHOUSE=""
OUT_DIR="${OUT:-$REPO/runs/gpu-check}"
STEPS=10
STEPS_GIVEN=0
# GPU_CHECK_TIME_SCALE (a whole number, default 1) multiplies the budget and every cap: a dry run on a busy CPU
# machine (the test suite's) is slower than the GPU run the budget is sized for, and a bet on its speed is not a check
TIME_SCALE="${GPU_CHECK_TIME_SCALE:-1}"
case "$TIME_SCALE" in ''|*[!0-9]*|0|0*) echo "gpu_check.sh: GPU_CHECK_TIME_SCALE must be a positive integer, got '$TIME_SCALE'" >&2; exit 2 ;; esac
BUDGET_S=$(( 460 * TIME_SCALE ))  # the whole script, install included; every check gets what is left, up to its own cap

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --wheelhouse) WHEELHOUSE="${2:?--wheelhouse needs a directory}"; shift ;;
    --out) OUT_DIR="${2:?--out needs a directory}"; shift ;;
    --steps) STEPS="${2:?--steps needs a number}"; STEPS_GIVEN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$STEPS" in ''|*[!0-9]*|0|0*) echo "gpu_check.sh: --steps must be a positive integer, got '$STEPS'" >&2; exit 2 ;; esac

# a dry run defaults to 2 steps (CPU); an explicit --steps is kept
if [ "$DRY_RUN" = 1 ]; then DEVICE=cpu; [ "$STEPS_GIVEN" = 0 ] && STEPS=2; else DEVICE=cuda; fi
if [ "$DRY_RUN" = 0 ] && [ -z "$WHEELHOUSE" ]; then WHEELHOUSE="$REPO/wheelhouse"; fi
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
RESULTS="$OUT_DIR/gpu_check.jsonl"
: > "$RESULTS"
START=$(date +%s)
export RELAX_GYM_CACHE="${RELAX_GYM_CACHE:-$OUT_DIR/cache}"

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
cap() { local want=$(( $1 * TIME_SCALE )) rest; rest=$(left); [ "$rest" -lt "$want" ] && want=$rest; [ "$want" -lt 1 ] && want=1; echo "$want"; }

# record NAME RC LOG [JSON]: one line in RESULTS; JSON (the check's own last stdout line) is merged in when valid
record() {
  "$PY" - "$1" "$2" "$3" "${4:-}" >> "$RESULTS" <<'PYEOF'
import json, sys
name, rc, log, line = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    data = json.loads(line) if line.strip() else None
except ValueError:
    data = None
if not isinstance(data, dict):
    try:
        tail = open(log, errors="replace").read().splitlines()[-15:]
    except OSError:
        tail = []
    why = "timed out" if rc in (124, 137) else f"exited {rc} without a JSON result"
    data = {"ok": False, "error": why, "log_tail": tail}
data = {"check": name, **{k: v for k, v in data.items() if k != "check"}, "rc": rc}
if rc != 0:
    data["ok"] = False
print(json.dumps(data))
PYEOF
  tail -n 1 "$RESULTS"
}

# run_check NAME SECONDS CMD...: the command's stdout's last line is its JSON result; stderr goes to OUT/NAME.log
run_check() {
  local name=$1 secs rc line cmd; secs=$(cap "$2"); shift 2
  cmd="$*"
  echo "== $name (up to ${secs}s): ${cmd:0:160}" >&2
  (cd "$OUT_DIR" && timeout --kill-after=15 "$secs" "$@" > "$OUT_DIR/$name.out" 2> "$OUT_DIR/$name.log")
  rc=$?
  line=$(tail -n 1 "$OUT_DIR/$name.out" 2>/dev/null || true)
  record "$name" "$rc" "$OUT_DIR/$name.log" "$line"
}

# -- env ----------------------------------------------------------------------------------------------------------
run_check env 60 "$PY" - "$DEVICE" "$DRY_RUN" <<'PYEOF'
import importlib.metadata as md, json, platform, sys
device, dry = sys.argv[1], sys.argv[2] == "1"
out = {"ok": True, "dry_run": dry, "device": device, "python": platform.python_version(), "executable": sys.executable}
for dist in ("torch", "transformers", "triton", "megatron-core", "ray", "numpy", "sglang"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
try:
    import torch
    out["cuda_available"] = torch.cuda.is_available()
    out["cuda"] = torch.version.cuda
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:  # noqa: BLE001
    out.update(ok=False, error=f"torch: {type(exc).__name__}: {exc}")
if device == "cuda" and not out.get("cuda_available"):
    out.update(ok=False, error="no CUDA device visible to torch")
if out["transformers"] is None:
    out.update(ok=False, error="transformers is not installed")
print(json.dumps(out))
PYEOF

# -- install (offline) ----------------------------------------------------------------------------------------------
SITE="$OUT_DIR/site"
if [ -n "$WHEELHOUSE" ]; then
  WHEELHOUSE="$(cd "$WHEELHOUSE" 2>/dev/null && pwd || echo "$WHEELHOUSE")"
  run_check install 120 bash -c '
    set -euo pipefail
    py="$1"; wh="$2"; site="$3"; repo="$4"
    [ -d "$wh" ] || { echo "{\"ok\": false, \"error\": \"no wheelhouse at $wh: run scripts/gpu_wheelhouse.sh where PyPI is reachable\"}"; exit 1; }
    want=$(cat "$wh/python-version" 2>/dev/null || echo "?")
    have=$("$py" -c "import sys; print(f\"{sys.version_info[0]}.{sys.version_info[1]}\")")
    [ "$want" = "$have" ] || { echo "{\"ok\": false, \"error\": \"the wheelhouse holds CPython $want wheels, this python is $have: PYTHON_VERSION=$have scripts/gpu_wheelhouse.sh\"}"; exit 1; }
    rm -rf "$site"
    "$py" -m pip install --no-index --no-deps --disable-pip-version-check --quiet --target "$site" "$wh"/*.whl >&2
    PYTHONPATH="$site" "$py" -m pip install --no-index --no-deps --no-build-isolation --disable-pip-version-check \
      --quiet --target "$site" "$repo" >&2
    cd "$site/.." && PYTHONPATH="$site" "$py" -c "
import importlib.metadata as md, json, relax_gym, sys
where = relax_gym.__file__
def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
# what the checks import (the site first, then the packages of the machine): the env step saw the machine alone
used = {d: version(d) for d in (\"transformers\", \"megatron-core\", \"ray\", \"huggingface-hub\", \"torch\")}
print(json.dumps({\"ok\": where.startswith(sys.argv[1]), \"relax_gym\": where, \"wheels\": int(sys.argv[2]), \"imports\": used}))" "$site" "$(ls "$wh"/*.whl | wc -l)"
  ' _ "$PY" "$WHEELHOUSE" "$SITE" "$REPO"
  export PYTHONPATH="$SITE"
else
  echo "{\"check\": \"install\", \"ok\": true, \"skipped\": \"dry run without --wheelhouse: the checks import $REPO\", \"rc\": 0}" >> "$RESULTS"
  tail -n 1 "$RESULTS"
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi

# -- the checks -----------------------------------------------------------------------------------------------------
if tail -n 1 "$RESULTS" | grep -q '"ok": true'; then
  run_check megatron 240 "$PY" -m relax_gym.trainer.tools.megatron_check --device "$DEVICE" --steps "$STEPS"
  # a one-machine Ray cluster that the check starts and stops itself: no token auth for it (docs/troubleshooting.md)
  RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" run_check megatron_group 180 "$PY" -m relax_gym.trainer.tools.megatron_check --device "$DEVICE" --group
  run_check dcs 180 "$PY" -m relax_gym.trainer.tools.transport_check --device "$DEVICE" --timeout-s $(( 150 * TIME_SCALE ))
  # the model check stops its own parts 25 s before the step's cap (it then reports, frees the GPU, removes its files)
  models_cap=$(cap 420)  # scaled by cap()
  if [ -n "${MODEL_CHECK_ARGS+set}" ]; then models_args="$MODEL_CHECK_ARGS"
  elif [ "$DRY_RUN" = 1 ]; then models_args="--layers 1 --freeze-vocab"
  else models_args=""; fi
  # shellcheck disable=SC2086  # MODEL_CHECK_ARGS is a list of arguments
  run_check models "$models_cap" "$PY" -m relax_gym.trainer.tools.model_check --device "$DEVICE" \
    --budget-s $(( models_cap > 35 ? models_cap - 25 : 10 )) --out "$OUT_DIR/models" $models_args
  case " $models_args " in *" --keep "*) ;; *) rm -rf "$OUT_DIR/models" ;; esac  # also after a kill: ~23 GB at full depth
else  # without relax-gym installed the checks would only fail on imports
  for name in megatron megatron_group dcs models; do
    echo "{\"check\": \"$name\", \"ok\": false, \"skipped\": \"the install failed\", \"rc\": 1}" >> "$RESULTS"
    tail -n 1 "$RESULTS"
  done
fi

# -- summary --------------------------------------------------------------------------------------------------------
WALL=$(( $(date +%s) - START ))
"$PY" - "$RESULTS" "$WALL" "$OUT_DIR/gpu-results.md" <<'PYEOF'
import json, sys
path, wall, md = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(line) for line in open(path) if line.strip()]
ok = all(r.get("ok") for r in rows)
summary = {"check": "summary", "ok": ok, "wall_s": wall, "checks": {r["check"]: bool(r.get("ok")) for r in rows}}
with open(path, "a") as f:
    f.write(json.dumps(summary) + "\n")
env = next((r for r in rows if r["check"] == "env"), {})
used = next((r for r in rows if r["check"] == "install"), {}).get("imports") or {}
carried = "".join(f", {d} {v} imported by the checks" for d, v in used.items()
                  if d in ("transformers", "megatron-core", "ray") and v and v != env.get(d))
lines = [f"Run: {'dry run (CPU)' if env.get('dry_run') else 'GPU'}; python {env.get('python')}, torch {env.get('torch')} "
         f"(CUDA {env.get('cuda')}, NCCL {env.get('nccl')}), transformers {env.get('transformers')} on the machine{carried}, "
         f"triton {env.get('triton')}; GPUs: {', '.join(env.get('gpus') or []) or 'none'}; wall {wall} s.", "",
         "| check | ok | result |", "|---|---|---|"]
for r in rows:
    keep = {k: v for k, v in r.items() if k not in ("check", "ok", "log_tail", "traceback")}
    lines.append(f"| {r['check']} | {'yes' if r.get('ok') else 'NO'} | `{json.dumps(keep)[:600]}` |")
open(md, "w").write("\n".join(lines) + "\n")
print(json.dumps(summary))
sys.exit(0 if ok else 1)
PYEOF
