#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 30) and prints how many inputs each
# executed. Exits non-zero if any target crashed, hung or failed to build.
#
#   scripts/fuzz.sh [SECONDS]
#
# Works on a stable toolchain: RUSTC_BOOTSTRAP=1 unlocks the nightly flags cargo-fuzz passes
# (-Zsanitizer=address, ...). If the AddressSanitizer build fails, it falls back to
# `--sanitizer none`. Set FUZZ_SANITIZER=address|none to choose.
#
# Corpora: new inputs go to fuzz/corpus/<target>/ (git-ignored); the committed seeds in
# fuzz/seeds/<target>/ are read as well. Crashing inputs land in fuzz/artifacts/<target>/.
# Reproduce one with `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <file>`; SOFT_FUZZ_TRACE=1
# (soft_datagrams), CM_FUZZ_TRACE=1 (cm_machine) and EP_FUZZ_TRACE=1 (endpoint_script) print
# what the input does.

set -uo pipefail
cd "$(dirname "$0")/.."

secs="${1:-30}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 [SECONDS]" >&2
    exit 2
fi

export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==== installing cargo-fuzz ===="
    cargo install --locked cargo-fuzz || exit 1
fi

targets=(roce_parse wire_headers ipoib_wire soft_datagrams cm_mad cm_machine endpoint_script cma_hdr sa_mad ib_wire)

sanitizer="${FUZZ_SANITIZER:-}"
if [ -z "$sanitizer" ]; then
    echo "==== cargo fuzz build (AddressSanitizer) ===="
    if cargo fuzz build --sanitizer address; then
        sanitizer=address
    else
        echo "AddressSanitizer build failed; falling back to --sanitizer none" >&2
        sanitizer=none
    fi
fi
if [ "$sanitizer" = none ] || [ -n "${FUZZ_SANITIZER:-}" ]; then
    echo "==== cargo fuzz build (sanitizer: $sanitizer) ===="
    cargo fuzz build --sanitizer "$sanitizer" || exit 1
fi

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

failed=()
total=0
summary=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    extra=()
    envs=()
    case "$t" in
        soft_datagrams) extra=(-max_len=8192) ;;
    esac
    echo "==== $t: ${secs}s ===="
    # The wall-clock cap leaves room for startup (loading the corpus) and the final report.
    timeout --signal=INT --kill-after=30 "$((secs + 60))" \
        env "${envs[@]}" cargo fuzz run --sanitizer "$sanitizer" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "${extra[@]}" >"$logs/$t.log" 2>&1
    rc=$?
    execs="$(grep -a 'stat::number_of_executed_units:' "$logs/$t.log" | tail -1 | awk '{print $2}')"
    execs="${execs:-?}"
    if [ "$rc" -eq 0 ]; then
        status=ok
        [ "$execs" != "?" ] && total=$((total + execs))
    else
        status="FAILED (exit $rc)"
        [ "$rc" -eq 124 ] && status="FAILED (wall-clock timeout)"
        failed+=("$t")
        echo "---- last lines of the $t log ----"
        grep -av '^"' "$logs/$t.log" | tail -40
        grep -a 'Test unit written to' "$logs/$t.log" || true
    fi
    line="$(printf '%-16s execs %-10s %s' "$t" "$execs" "$status")"
    echo "$line"
    summary+=("$line")
done

echo "==== summary (sanitizer: $sanitizer, ${secs}s per target) ===="
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: ${#failed[@]} of ${#targets[@]} targets FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzz: all ${#targets[@]} targets ok, $total inputs executed"
