//! `cargo test` run with its output echoed and its `test result:` lines
//! totalled (the test command, a scenario's test).

use std::process::Command;

/// How many of the slowest tests the test command names at its end.
const SLOWEST: usize = 15;

/// Runs `cargo test --workspace`, echoing its output, and ends with the
/// slowest tests (each test binary runs under
/// `xtask/scripts/timed-test-runner.sh`, which has libtest time each test)
/// and one line totalling every test binary's result.
pub fn run_tests(mut cmd: Command, args: &[String]) -> anyhow::Result<i32> {
    let runner = crate::workspace_root().join("xtask/scripts/timed-test-runner.sh");
    cmd.args([
        "test",
        "--workspace",
        "--no-fail-fast",
        "--features",
        crate::FAILPOINT_FEATURES,
        "--config",
        &format!("target.'cfg(all())'.runner = [{:?}]", runner.display().to_string()),
    ])
    .args(args);
    let run = run_counted(cmd)?;
    let mut timed: Vec<(String, f64)> = run
        .timed
        .iter()
        .map(|(name, secs)| (name.clone(), secs - run.waits.get(name).copied().unwrap_or(0.0)))
        .collect();
    timed.sort_by(|a, b| b.1.total_cmp(&a.1));
    if !timed.is_empty() {
        println!("the {} slowest tests:", SLOWEST.min(timed.len()));
        for (name, secs) in timed.iter().take(SLOWEST) {
            println!("  {secs:>8.1} s  {name}");
        }
    }
    if !run.panics.is_empty() {
        // The end of the output is what a CI log shows: why each test failed.
        println!("why they failed (each panic, its first lines):");
        for panic in &run.panics {
            println!("{panic}");
        }
    }
    println!("all tests: {} passed, {} failed", run.passed, run.failed);
    if run.failed == 0 && !run.status.success() {
        // A binary that died (a signal, an abort) or did not build prints no
        // `test result:` line: cargo's own error above names it.
        println!("cargo test itself failed ({}): see its error above", run.status);
    }
    Ok(run.exit_code())
}

/// What a `cargo test` run reported.
pub struct TestRun {
    status: std::process::ExitStatus,
    pub passed: u64,
    pub failed: u64,
    /// Each test libtest timed (`--report-time`): name, seconds.
    pub timed: Vec<(String, f64)>,
    /// Seconds each end-to-end test waited for its share of the machine
    /// (`machine-wait` lines), by test.
    pub waits: std::collections::BTreeMap<String, f64>,
    /// Each panic's `thread '…' panicked at` line and the lines after it
    /// (its message), shortened.
    pub panics: Vec<String>,
}

impl TestRun {
    /// 0 when the run succeeded and no test failed.
    pub fn exit_code(&self) -> i32 {
        if self.status.success() && self.failed == 0 {
            0
        } else {
            self.status.code().unwrap_or(1).max(1)
        }
    }
}

/// Runs `cmd` (a `cargo test`), echoing its output, and totals the
/// `test result:` lines of every test binary.
pub fn run_counted(mut cmd: Command) -> anyhow::Result<TestRun> {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn()?;
    let (mut passed, mut failed, mut timed) = (0u64, 0u64, Vec::new());
    let mut waits = std::collections::BTreeMap::new();
    let mut panics = Panics::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        panics.read(&line);
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += result_count(rest, " passed");
            failed += result_count(rest, " failed");
        }
        timed.extend(duration(&line));
        if let Some((name, secs)) = machine_wait(&line) {
            *waits.entry(name).or_insert(0.0) += secs;
        }
    }
    let status = child.wait()?;
    Ok(TestRun {
        status,
        passed,
        failed,
        timed,
        waits,
        panics: panics.found,
    })
}

/// Lines kept of a panic's message after its `panicked at` line.
const PANIC_LINES: usize = 3;
/// Characters kept of each such line.
const PANIC_WIDTH: usize = 400;

/// Collects each panic's header and the first lines of its message.
#[derive(Default)]
struct Panics {
    found: Vec<String>,
    /// Lines still to keep of the current panic's message.
    open: usize,
}

impl Panics {
    fn read(&mut self, line: &str) {
        if line.starts_with("thread '") && line.contains("' panicked at ") {
            self.found.push(format!("  {}", shorten(line)));
            self.open = PANIC_LINES;
        } else if self.open > 0 {
            self.open -= 1;
            if line.starts_with("note: ") || line.is_empty() {
                self.open = 0;
            } else if let Some(last) = self.found.last_mut() {
                last.push_str("\n    ");
                last.push_str(&shorten(line));
            }
        }
    }
}

fn shorten(line: &str) -> String {
    match line.char_indices().nth(PANIC_WIDTH) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

/// A `machine-wait <test> <seconds>` line of the end-to-end tests.
fn machine_wait(line: &str) -> Option<(String, f64)> {
    let mut words = line.strip_prefix("machine-wait ")?.split(' ');
    let (name, secs) = (words.next()?, words.next()?.parse().ok()?);
    Some((name.to_owned(), secs))
}

/// A test's name and duration from libtest's `--report-time` line
/// (`test a::b ... ok <12.345s>`).
fn duration(line: &str) -> Option<(String, f64)> {
    let rest = line.strip_prefix("test ")?;
    let (name, outcome) = rest.split_once(" ... ")?;
    let secs = outcome.rsplit_once('<')?.1.strip_suffix("s>")?.parse().ok()?;
    Some((name.to_owned(), secs))
}

/// The number before `word` in a `test result:` line's rest
/// ("ok. 3 passed; 0 failed; …").
fn result_count(rest: &str, word: &str) -> u64 {
    rest.split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(word)
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{duration, machine_wait, result_count, Panics};

    #[test]
    fn a_panic_is_kept_with_its_message_and_nothing_after() {
        let mut panics = Panics::default();
        for line in [
            "test x::y ... FAILED <2.0s>",
            "thread 'x::y' panicked at e2e/tests/e2e/chaos.rs:123:5:",
            "[\"3 orders lost\"]",
            "note: run with `RUST_BACKTRACE=1`",
            "test result: FAILED. 0 passed; 1 failed",
        ] {
            panics.read(line);
        }
        assert_eq!(
            panics.found,
            ["  thread 'x::y' panicked at e2e/tests/e2e/chaos.rs:123:5:\n    [\"3 orders lost\"]"]
        );
    }

    #[test]
    fn a_machine_wait_line_gives_its_test_and_seconds() {
        assert_eq!(
            machine_wait("machine-wait chaos::a_run 12.500"),
            Some(("chaos::a_run".to_owned(), 12.5))
        );
        assert_eq!(machine_wait("test chaos::a_run ... ok <1.0s>"), None);
    }

    #[test]
    fn a_timed_line_gives_its_test_and_seconds_and_others_nothing() {
        assert_eq!(
            duration("test chaos::a_run ... ok <177.510s>"),
            Some(("chaos::a_run".to_owned(), 177.51))
        );
        assert_eq!(duration("test x::y ... FAILED <2.000s>").map(|d| d.1), Some(2.0));
        assert_eq!(duration("test x::y ... ok"), None);
        assert_eq!(duration("test result: ok. 3 passed"), None);
    }

    #[test]
    fn a_result_line_is_counted_and_a_run_of_no_test_is_zero() {
        let ok = "ok. 3 passed; 0 failed; 1 ignored; 0 measured; 36 filtered out; finished in 87.66s";
        assert_eq!((result_count(ok, " passed"), result_count(ok, " failed")), (3, 0));
        let failed = "FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out";
        assert_eq!(
            (result_count(failed, " passed"), result_count(failed, " failed")),
            (1, 2)
        );
        let none = "ok. 0 passed; 0 failed; 0 ignored; 0 measured; 39 filtered out; finished in 0.00s";
        assert_eq!(result_count(none, " passed"), 0);
    }
}
