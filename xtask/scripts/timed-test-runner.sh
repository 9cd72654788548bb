#!/bin/sh
# cargo test's runner under `cargo xtask test`: runs one test binary with
# libtest's per-test durations (`--report-time`, an unstable flag libtest
# accepts when RUSTC_BOOTSTRAP is set in the test's own environment only —
# the compiler never sees it, so no build changes). `cargo xtask test`
# totals the durations and prints the slowest tests at the end.
exec env RUSTC_BOOTSTRAP=1 "$@" -Z unstable-options --report-time
