//! Child processes a test started.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Waits for `child` at most `limit`, then kills it (by its own pid; it is ours); its output.
pub(crate) fn output_within(mut child: Child, limit: Duration) -> Output {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("child output")
}
