//! Gathered turns (`edge.gather`) for a separate edge process on one thread.
//!
//! Each point is one TCP segment from its phone. Woken for every few of them, the edge spends
//! more on waking (`epoll_wait`, the scheduler) than on the points; a do-nothing reader on this
//! box costs 6.0 µs a point woken at once and 4.2 µs with 1 ms sleeps between turns
//! (docs/edge.md, "Where the time goes"). So the one thread sleeps between turns of its event
//! loop: the points that arrive meanwhile wait in their sockets, and the next turn finds them
//! all ready at once. A turn whose work took the thread's CPU for the whole gather is followed
//! by no sleep: a saturated edge never idles. (CPU time, not wall time: on a shared box a turn
//! that was only descheduled is not busy.)

use std::time::Duration;

/// Whether to sleep before the next turn, after a turn that used `busy` of the thread's CPU.
fn sleep_before_next(busy: Duration, gather: Duration) -> bool {
    busy < gather
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given; CLOCK_THREAD_CPUTIME_ID is
    // always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs forever on a current-thread runtime: sleeps `gather` between turns (blocking the
/// thread on purpose: nothing else should run meanwhile), then yields so that the runtime
/// polls its I/O driver and runs every session that became ready. Spawned by the `edge`
/// command when it runs on one thread; ends with the runtime.
pub async fn gather_turns(gather: Duration) {
    if gather.is_zero() {
        return;
    }
    let mut woke = thread_cpu();
    loop {
        if sleep_before_next(thread_cpu().saturating_sub(woke), gather) {
            std::thread::sleep(gather);
        }
        woke = thread_cpu();
        // Deferred until the runtime has polled the driver: the turn runs before we return.
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_busy_turn_is_not_followed_by_a_sleep() {
        let g = Duration::from_millis(1);
        assert!(sleep_before_next(Duration::from_micros(200), g));
        assert!(!sleep_before_next(Duration::from_millis(1), g));
        assert!(!sleep_before_next(Duration::from_millis(3), g));
    }

    /// Another task's turns on the same thread are spaced by the gather: ten yields of it take
    /// at least ten gathers (a lower bound, which a slow machine cannot break).
    #[test]
    fn turns_are_spaced_by_the_gather() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let gather = Duration::from_millis(3);
        let took = rt.block_on(async move {
            tokio::spawn(gather_turns(gather));
            let t0 = Instant::now();
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            t0.elapsed()
        });
        assert!(took >= gather * 9, "{took:?}");
    }

    #[test]
    fn thread_cpu_counts_work_not_sleep() {
        let t0 = thread_cpu();
        std::thread::sleep(Duration::from_millis(20));
        let slept = thread_cpu() - t0;
        let t1 = thread_cpu();
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {}
        let worked = thread_cpu() - t1;
        assert!(slept < Duration::from_millis(10), "{slept:?}");
        assert!(worked > slept, "{worked:?} {slept:?}");
    }

    #[test]
    fn no_gather_no_pacing() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(gather_turns(Duration::ZERO)); // returns at once
    }
}
