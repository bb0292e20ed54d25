//! The provider conformance suite ([`crate::verbs::conformance`]) over two [`HwVerbs`]
//! devices that reach each other (in the rxe lab: `rxe0` and `rxe1` in one guest).

use std::time::Duration;

use super::{HwConfig, HwError, HwVerbs};
use crate::verbs::conformance::{self, ConformancePair};
use crate::verbs::Provider;

/// Two opened devices.
#[derive(Debug)]
pub struct HwPair {
    a: HwVerbs,
    b: HwVerbs,
    settle: Duration,
}

impl HwPair {
    /// Opens both devices; one settle sleeps `settle` (hardware needs no virtual clock).
    ///
    /// # Errors
    /// The first device that cannot be opened.
    pub fn open(a: &HwConfig, b: &HwConfig, settle: Duration) -> Result<Self, HwError> {
        Ok(Self {
            a: HwVerbs::open(a)?,
            b: HwVerbs::open(b)?,
            settle,
        })
    }

    /// Runs every check (or only `only`), printing `RESULT conformance_NAME PASS|FAIL` lines;
    /// returns the number of failures.
    pub fn run(&mut self, only: Option<&str>) -> usize {
        let mut failed = 0;
        for (name, f) in conformance::checks::<HwVerbs, Self>() {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            let t0 = std::time::Instant::now();
            let r = f(self);
            let ms = t0.elapsed().as_millis();
            match r {
                Ok(()) => println!("RESULT conformance_{name} PASS {ms} ms"),
                Err(e) => {
                    failed += 1;
                    println!("RESULT conformance_{name} FAIL {ms} ms: {e}");
                }
            }
        }
        failed
    }
}

impl ConformancePair<HwVerbs> for HwPair {
    fn providers(&mut self) -> (&mut HwVerbs, &mut HwVerbs) {
        (&mut self.a, &mut self.b)
    }

    fn settle(&mut self) {
        std::thread::sleep(self.settle);
        let now = std::time::Instant::now();
        let _ = self.a.handle_io(now);
        let _ = self.b.handle_io(now);
    }
}
