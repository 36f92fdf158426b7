//! The open-file limit: every phone, viewer or simulated courier connection is a descriptor, so
//! the edge, the viewer gateway and the simulator raise it at start-up (the one copy of this
//! rule; it is the only system call in this crate outside the client features).

/// Raises this process's RLIMIT_NOFILE soft limit to the hard limit, and both past it up to
/// `want` where the process may (root: up to `fs.nr_open`). Never lowers it. Returns the soft
/// limit in force afterwards (0 when it cannot be read).
///
/// All the way to the hard limit even when `want` is less: a descriptor costs nothing until it
/// is opened, and `want` only estimates what the run opens (watchers, reconnects, the
/// connections a dropped phone leaves closing).
pub fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct handed to them.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    let want = rlim(want);
    if want > r.rlim_max {
        // The kernel refuses a hard limit past fs.nr_open, even to root.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(r.rlim_max, rlim);
        let up = want.min(nr_open).max(r.rlim_max);
        let raised = libc::rlimit {
            rlim_cur: up,
            rlim_max: up,
        };
        if up > r.rlim_max && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return u64_of(up);
        }
    }
    // Not allowed past the hard limit (or not needed): the hard limit is anyone's to take.
    if r.rlim_cur < r.rlim_max {
        let capped = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } == 0 {
            return u64_of(r.rlim_max);
        }
    }
    u64_of(r.rlim_cur)
}

// rlim_t is u64 on Linux but not on every target, so the casts stay.
#[allow(clippy::unnecessary_cast)]
fn rlim(n: u64) -> libc::rlim_t {
    n.min(libc::rlim_t::MAX as u64) as libc::rlim_t
}

#[allow(clippy::unnecessary_cast)]
fn u64_of(n: libc::rlim_t) -> u64 {
    n as u64
}

#[cfg(test)]
mod tests {
    fn get() -> libc::rlimit {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        r
    }

    #[test]
    fn raises_the_soft_limit_to_the_hard_limit() {
        let r = get();
        // Below the hard limit first (anyone may lower the soft limit and raise it back).
        let lowered = libc::rlimit {
            rlim_cur: r.rlim_max / 2,
            rlim_max: r.rlim_max,
        };
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        let got = super::raise_nofile(64);
        // At least: another test may raise the hard limit meanwhile, where the process may.
        assert!(get().rlim_cur >= r.rlim_max);
        assert!(got >= super::u64_of(r.rlim_max));
    }

    #[test]
    fn never_lowers_the_limit() {
        let before = super::raise_nofile(0);
        assert!(before > 0);
        assert!(super::raise_nofile(before + 16) >= before);
    }
}
