#!/usr/bin/env bash
# Runs Cachet's fuzz targets with libFuzzer (cargo-fuzz, nightly toolchain), each for a set time,
# all at once, and prints one line per target: runs, coverage, corpus, and whether it failed.
#
#   scripts/fuzz.sh                      # every target, 10 minutes each
#   scripts/fuzz.sh -t 60 request gguf   # two targets, a minute each
#   scripts/fuzz.sh --build-only         # build the binaries (to run elsewhere with --bin-dir)
#   scripts/fuzz.sh --bin-dir DIR -t 600 # run binaries built before (no toolchain needed)
#   scripts/fuzz.sh --asan ...           # build with AddressSanitizer (slower; the code under test
#                                        # is safe Rust, so the default is Rust's own checks only)
#
# Targets: request, template_reply, template_module, normalizer, gguf, safetensors, schema, lark
# (see fuzz/src/lib.rs). New corpus entries go to fuzz/work/<target>/ (ignored by git); an input a
# target fails on is written to fuzz/work/artifacts/<target>/ — commit it under
# fuzz/corpus/<target>/crash-<what> once fixed, so CI replays it (fuzz/tests/corpus.rs).
# Logs: fuzz/work/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=600
build_only=0
sanitizer=none
bin_dir=""
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t) secs="$2"; shift 2 ;;
        --build-only) build_only=1; shift ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --asan) sanitizer=address; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(request template_reply template_module normalizer gguf safetensors schema lark)

if [ -z "$bin_dir" ]; then
    rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
    cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
    # Release code with debug assertions (overflow checks are part of what is tested).
    for t in "${targets[@]}"; do
        (cd fuzz && cargo +nightly fuzz build --features libfuzzer --debug-assertions --sanitizer "$sanitizer" "$t")
    done
    bin_dir="target/x86_64-unknown-linux-gnu/release"
    if [ "$build_only" = 1 ]; then
        for t in "${targets[@]}"; do ls -la "$bin_dir/$t"; done
        exit 0
    fi
fi

mkdir -p fuzz/work/logs
pids=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/work/$t" "fuzz/work/artifacts/$t"
    "$bin_dir/$t" "fuzz/work/$t" "fuzz/corpus/$t" \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="fuzz/work/artifacts/$t/" -print_final_stats=1 \
        >"fuzz/work/logs/$t.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
    t="${targets[$i]}"
    if wait "${pids[$i]}"; then verdict="ok"; else verdict="FAILED"; status=1; fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "fuzz/work/logs/$t.log" | grep -o '[0-9]*$' || echo "?")
    last=$(grep -E '^#[0-9]+' "fuzz/work/logs/$t.log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' || true)
    echo "$t: $verdict, ${secs} s, $runs runs, $last"
done
exit $status
