//! `sqlx::migrate!` embeds the migrations at compile time but does not tell
//! cargo to watch their directory: without this, a new migration file is
//! left out of the build until something else changes in the crate.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/inventory");
}
