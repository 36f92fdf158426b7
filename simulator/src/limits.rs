//! The open-file limit: one connection per courier needs one descriptor per courier.

/// Raises this process's RLIMIT_NOFILE soft limit to at least `want` where it can: up to the
/// hard limit, and past it when the process may (root: up to `fs.nr_open`). Returns the soft
/// limit in force afterwards.
pub fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct handed to them.
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    if r.rlim_cur as u64 >= want {
        return r.rlim_cur as u64;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(r.rlim_max as u64);
    let raised = libc::rlimit {
        rlim_cur: want.min(nr_open) as libc::rlim_t,
        rlim_max: (r.rlim_max as u64).max(want.min(nr_open)) as libc::rlim_t,
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return raised.rlim_cur as u64;
    }
    // Not allowed past the hard limit: take what the hard limit gives.
    let capped = libc::rlimit {
        rlim_cur: r.rlim_max,
        rlim_max: r.rlim_max,
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } == 0 {
        return capped.rlim_cur as u64;
    }
    r.rlim_cur as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_lowers_the_limit() {
        let before = super::raise_nofile(0);
        assert!(before > 0);
        assert!(super::raise_nofile(before + 16) >= before);
    }
}
