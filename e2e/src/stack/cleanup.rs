//! What a stack dropped without `Stack::shutdown` leaves behind: with
//! `remove_run_dir_on_drop`, nothing after a passing test, the logs after a failing one.

use std::time::Duration;

use super::Stack;

impl Drop for Stack {
    /// A test that panics still leaves no databases behind: processes die
    /// with their handles (`kill_on_drop`), databases are dropped here. The
    /// run directory (logs, the own server's and the brokers' data) goes
    /// too when [`super::StackOptions::remove_run_dir_on_drop`] asks, unless
    /// the test failed: then its logs are what is left to read.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if self.opts.remove_run_dir_on_drop && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.opts.run_dir);
        }
        for child in self
            .procs
            .values_mut()
            .chain(self.extras.iter_mut().map(|(_, c)| c))
            .chain(self.node_procs.values_mut())
        {
            let _ = child.start_kill();
        }
        // An own server is killed with its field; its data is in the run directory.
        if self.postgres.is_some() {
            return;
        }
        let urls: Vec<String> = super::roles::OWNED.map(|(_, d)| self.db_url(d)).to_vec();
        // A moment for the killed processes to go.
        std::thread::sleep(Duration::from_millis(200));
        testkit::db::drop_databases_blocking(urls);
        // Then their owners (a role that owns a database cannot go first).
        testkit::db::drop_roles_blocking(self.opts.pg_base.clone(), self.roles.all());
    }
}
