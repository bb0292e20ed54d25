//! The calling thread's CPU time (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`).

use std::time::Duration;

/// CPU time the calling thread has used (user and system); zero where the clock cannot be
/// read.
pub(crate) fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID needs no other argument.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_thread_uses_cpu_time() {
        let before = super::cpu_time();
        let mut x = 0_u64;
        for i in 0..2_000_000_u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(super::cpu_time() > before, "{x}");
    }
}
