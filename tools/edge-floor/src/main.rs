//! floor: the kernel floor of an MQTT edge's CPU per point. Terminates MQTT (3.1.1 and 5) over
//! plain TCP, answers CONNECT (CONNACK, any credentials), PINGREQ (PINGRESP), QoS 1 PUBLISH
//! (PUBACK), counts PUBLISH packets and discards them. Forwards nothing, checks nothing.
//!
//!   floor epoll 127.0.0.1:1883[,127.0.0.2:1883,...]
//!   floor uring 127.0.0.1:1883[,...]
//!
//! Every 5 s prints: `tick <unix_ms> pub <total publishes> cpu_us <utime+stime total> conns <n>
//! enters <syscalls that waited: epoll_wait / io_uring_enter> recvs <recv calls / recv CQEs>`.
//! Env (uring): FLOOR_WAIT_NR (completions to wait for per io_uring_enter, default 1),
//! FLOOR_WAIT_US (timeout for that wait, default 1000000). Env (epoll): FLOOR_GATHER_US (sleep
//! before each epoll_wait, default 0).

use std::net::SocketAddrV4;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TICK: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Conn {
    carry: Vec<u8>,
    v5: bool,
}

#[derive(Default)]
struct Stats {
    publishes: u64,
    enters: u64,
    recvs: u64,
    conns: u64,
}

fn cpu_us() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn print_tick(s: &Stats) {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    println!(
        "tick {ms} pub {} cpu_us {} conns {} enters {} recvs {}",
        s.publishes,
        cpu_us(),
        s.conns,
        s.enters,
        s.recvs
    );
}

/// Parses whole packets of `data`; appends answers to `out`. Returns false: close.
fn parse(conn: &mut Conn, data: &[u8], out: &mut Vec<u8>, st: &mut Stats) -> bool {
    let mut carried = std::mem::take(&mut conn.carry);
    let buf: &[u8] = if carried.is_empty() {
        data
    } else {
        carried.extend_from_slice(data);
        &carried
    };
    let mut i = 0;
    let ok = loop {
        let rest = &buf[i..];
        if rest.len() < 2 {
            break true;
        }
        // remaining length, 1-4 bytes
        let (mut len, mut mul, mut n) = (0usize, 1usize, 1usize);
        let mut complete = false;
        while n < rest.len() && n <= 4 {
            let b = rest[n];
            len += (b & 0x7f) as usize * mul;
            mul <<= 7;
            n += 1;
            if b & 0x80 == 0 {
                complete = true;
                break;
            }
        }
        if !complete {
            if n > 4 {
                break false;
            }
            break true;
        }
        if rest.len() < n + len {
            break true;
        }
        let head = rest[0];
        let body = &rest[n..n + len];
        match head >> 4 {
            3 => {
                st.publishes += 1;
                let qos = (head >> 1) & 3;
                if qos > 0 && body.len() >= 2 {
                    let tl = u16::from_be_bytes([body[0], body[1]]) as usize;
                    if body.len() >= 4 + tl {
                        out.extend_from_slice(&[0x40, 0x02, body[2 + tl], body[3 + tl]]);
                    }
                }
            }
            1 => {
                // CONNECT: protocol name (2-byte length + name), then the level byte.
                if body.len() >= 3 {
                    let nl = u16::from_be_bytes([body[0], body[1]]) as usize;
                    conn.v5 = body.get(2 + nl) == Some(&5);
                }
                if conn.v5 {
                    out.extend_from_slice(&[0x20, 0x03, 0x00, 0x00, 0x00]);
                } else {
                    out.extend_from_slice(&[0x20, 0x02, 0x00, 0x00]);
                }
            }
            12 => out.extend_from_slice(&[0xd0, 0x00]),
            8 => {
                // SUBSCRIBE: grant QoS 0 to one filter (not used by the simulator's phones).
                if body.len() >= 2 {
                    out.extend_from_slice(&[0x90, 0x03, body[0], body[1], 0x00]);
                }
            }
            14 => break false,
            _ => {}
        }
        i += n + len;
    };
    if ok && i < buf.len() {
        let left = buf[i..].to_vec();
        conn.carry = left;
    }
    ok
}

fn listeners(spec: &str) -> Vec<i32> {
    spec.split(',')
        .map(|a| {
            let a: SocketAddrV4 = a.trim().parse().expect("addr: ip:port");
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
                assert!(fd >= 0);
                let one: i32 = 1;
                for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
                    libc::setsockopt(fd, libc::SOL_SOCKET, opt, &one as *const i32 as *const _, 4);
                }
                let sa = libc::sockaddr_in {
                    sin_family: libc::AF_INET as u16,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*a.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                let r = libc::bind(
                    fd,
                    &sa as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                );
                assert!(r == 0, "bind {a}: {}", std::io::Error::last_os_error());
                assert!(libc::listen(fd, 4096) == 0);
                fd
            }
        })
        .collect()
}

fn nodelay(fd: i32) {
    let one: i32 = 1;
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const i32 as *const _,
            4,
        )
    };
}

fn slot(conns: &mut Vec<Option<Box<Conn>>>, fd: i32) -> &mut Option<Box<Conn>> {
    let fd = fd as usize;
    if conns.len() <= fd {
        conns.resize_with(fd + 1, || None);
    }
    &mut conns[fd]
}

// ---------------------------------------------------------------- epoll (level-triggered)

fn run_epoll(spec: &str) {
    let lfds = listeners(spec);
    let ep = unsafe { libc::epoll_create1(0) };
    const LISTEN_TAG: u64 = 1 << 40;
    for &l in &lfds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: LISTEN_TAG | l as u64,
        };
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, l, &mut ev) };
    }
    let mut conns: Vec<Option<Box<Conn>>> = Vec::new();
    let mut st = Stats::default();
    let mut events: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::with_capacity(256);
    let mut next = Instant::now() + TICK;
    // FLOOR_GATHER_US: sleep this long before each epoll_wait (at most one wake-up per period,
    // at the cost of that much added latency; the counterpart of io_uring's FLOOR_WAIT_NR).
    let gather_us: u64 = std::env::var("FLOOR_GATHER_US")
        .ok()
        .map(|v| v.parse().unwrap())
        .unwrap_or(0);
    loop {
        let now = Instant::now();
        if now >= next {
            print_tick(&st);
            next += TICK;
        }
        if gather_us > 0 {
            std::thread::sleep(Duration::from_micros(gather_us));
        }
        let timeout = (next - Instant::now()).as_millis() as i32 + 1;
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, timeout) };
        st.enters += 1;
        if n < 0 {
            continue;
        }
        for e in &events[..n as usize] {
            let data = e.u64;
            if data & LISTEN_TAG != 0 {
                let l = (data & 0xffff_ffff) as i32;
                loop {
                    let fd = unsafe {
                        libc::accept4(
                            l,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            libc::SOCK_NONBLOCK,
                        )
                    };
                    if fd < 0 {
                        break;
                    }
                    nodelay(fd);
                    *slot(&mut conns, fd) = Some(Box::default());
                    st.conns += 1;
                    let mut ev = libc::epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: fd as u64,
                    };
                    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
                }
                continue;
            }
            let fd = data as i32;
            let r = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut _, buf.len(), 0) };
            st.recvs += 1;
            if r < 0 {
                let err = std::io::Error::last_os_error().raw_os_error();
                if err == Some(libc::EAGAIN) || err == Some(libc::EINTR) {
                    continue;
                }
            }
            let mut keep = r > 0;
            if keep {
                let c = slot(&mut conns, fd).as_mut().expect("conn");
                out.clear();
                keep = parse(c, &buf[..r as usize], &mut out, &mut st);
                if !out.is_empty() {
                    unsafe {
                        libc::send(
                            fd,
                            out.as_ptr() as *const _,
                            out.len(),
                            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                        )
                    };
                }
            }
            if !keep {
                *slot(&mut conns, fd) = None;
                st.conns -= 1;
                unsafe { libc::close(fd) };
            }
        }
    }
}

// ---------------------------------------------------------------- io_uring

const K_ACCEPT: u64 = 1;
const K_RECV: u64 = 2;
const K_SEND: u64 = 3;
const K_TICK: u64 = 4;

fn ud(kind: u64, v: u64) -> u64 {
    (kind << 56) | v
}

fn run_uring(spec: &str) {
    use io_uring::{cqueue, opcode, squeue, types, IoUring};
    let wait_nr: usize = std::env::var("FLOOR_WAIT_NR")
        .ok()
        .map(|v| v.parse().unwrap())
        .unwrap_or(1);
    let wait_us: u64 = std::env::var("FLOOR_WAIT_US")
        .ok()
        .map(|v| v.parse().unwrap())
        .unwrap_or(1_000_000);
    let lfds = listeners(spec);
    let mut ring: IoUring<squeue::Entry, cqueue::Entry> = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(32768)
        .build(4096)
        .expect("io_uring setup (SINGLE_ISSUER|DEFER_TASKRUN)");

    // Provided buffer ring: NBUF buffers of BUFSZ bytes, group 0.
    const NBUF: u16 = 4096;
    const BUFSZ: usize = 2048;
    const BGID: u16 = 0;
    let ring_bytes = NBUF as usize * std::mem::size_of::<types::BufRingEntry>();
    let br = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ring_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    } as *mut types::BufRingEntry;
    assert!(br as isize != -1);
    let mut bufs = vec![0u8; NBUF as usize * BUFSZ];
    let base = bufs.as_mut_ptr();
    let mask = NBUF - 1;
    let tail_ptr = unsafe { types::BufRingEntry::tail(br) } as *mut u16;
    let mut tail: u16 = 0;
    let push_buf = |tail: &mut u16, bid: u16| unsafe {
        let e = &mut *br.add((*tail & mask) as usize);
        e.set_addr(base.add(bid as usize * BUFSZ) as u64);
        e.set_len(BUFSZ as u32);
        e.set_bid(bid);
        *tail = tail.wrapping_add(1);
    };
    for bid in 0..NBUF {
        push_buf(&mut tail, bid);
    }
    unsafe {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        std::ptr::write_volatile(tail_ptr, tail);
        ring.submitter()
            .register_buf_ring_with_flags(br as u64, NBUF, BGID, 0)
            .expect("register_buf_ring");
    }

    let mut st = Stats::default();
    let mut conns: Vec<Option<Box<Conn>>> = Vec::new();
    let mut pending: Vec<squeue::Entry> = Vec::new();
    for &l in &lfds {
        pending.push(
            opcode::AcceptMulti::new(types::Fd(l))
                .build()
                .user_data(ud(K_ACCEPT, l as u64)),
        );
    }
    let tick_ts = types::Timespec::new().sec(TICK.as_secs());
    // Rearmed when the kernel ends the multishot timeout.
    let tick_sqe = || {
        opcode::Timeout::new(&tick_ts)
            .count(0)
            .flags(types::TimeoutFlags::MULTISHOT)
            .build()
            .user_data(ud(K_TICK, 0))
    };
    pending.push(tick_sqe());
    let wait_ts = types::Timespec::new()
        .sec(wait_us / 1_000_000)
        .nsec(((wait_us % 1_000_000) * 1000) as u32);
    let recv_sqe = |fd: i32| {
        opcode::RecvMulti::new(types::Fd(fd), BGID)
            .build()
            .user_data(ud(K_RECV, fd as u64))
    };
    let mut out: Vec<u8> = Vec::with_capacity(256);
    let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(4096);
    loop {
        {
            let mut sq = ring.submission();
            for e in pending.drain(..) {
                while unsafe { sq.push(&e) }.is_err() {
                    drop(sq);
                    ring.submit().unwrap();
                    sq = ring.submission();
                }
            }
        }
        let args = types::SubmitArgs::new().timespec(&wait_ts);
        match ring.submitter().submit_with_args(wait_nr, &args) {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::ETIME)
                    || e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => panic!("io_uring_enter: {e}"),
        }
        st.enters += 1;
        cqes.clear();
        cqes.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        let mut returned = false;
        for &(u, res, flags) in &cqes {
            let kind = u >> 56;
            let v = u & ((1 << 56) - 1);
            match kind {
                K_ACCEPT => {
                    if res >= 0 {
                        nodelay(res);
                        *slot(&mut conns, res) = Some(Box::default());
                        st.conns += 1;
                        pending.push(recv_sqe(res));
                    }
                    if !cqueue::more(flags) {
                        pending.push(
                            opcode::AcceptMulti::new(types::Fd(v as i32))
                                .build()
                                .user_data(u),
                        );
                    }
                }
                K_RECV => {
                    let fd = v as i32;
                    st.recvs += 1;
                    let mut keep = res > 0;
                    if res > 0 {
                        let bid = cqueue::buffer_select(flags).expect("buffer id");
                        let data = unsafe {
                            std::slice::from_raw_parts(base.add(bid as usize * BUFSZ), res as usize)
                        };
                        out.clear();
                        keep = match slot(&mut conns, fd).as_mut() {
                            Some(c) => parse(c, data, &mut out, &mut st),
                            None => false,
                        };
                        push_buf(&mut tail, bid);
                        returned = true;
                        if keep && !out.is_empty() {
                            let b = out.clone().into_boxed_slice();
                            let (p, n) = (b.as_ptr(), b.len() as u32);
                            let raw = Box::into_raw(Box::new(b));
                            pending.push(
                                opcode::Send::new(types::Fd(fd), p, n)
                                    .flags(libc::MSG_NOSIGNAL)
                                    .build()
                                    .user_data(ud(K_SEND, raw as u64)),
                            );
                        }
                        if keep && !cqueue::more(flags) {
                            pending.push(recv_sqe(fd));
                        }
                    } else if res == -libc::ENOBUFS {
                        keep = true;
                        pending.push(recv_sqe(fd));
                    }
                    if !keep && slot(&mut conns, fd).is_some() {
                        *slot(&mut conns, fd) = None;
                        st.conns -= 1;
                        // shutdown ends the multishot recv; close frees the fd
                        unsafe { libc::close(fd) };
                    }
                }
                K_SEND => unsafe {
                    drop(Box::from_raw(v as *mut Box<[u8]>));
                },
                K_TICK => {
                    print_tick(&st);
                    if !cqueue::more(flags) {
                        pending.push(tick_sqe());
                    }
                }
                _ => {}
            }
        }
        if returned {
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            unsafe { std::ptr::write_volatile(tail_ptr, tail) };
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: floor epoll|uring ip:port[,ip:port...]");
        std::process::exit(2);
    }
    // stdout is a file: flush every line
    match args[1].as_str() {
        "epoll" => run_epoll(&args[2]),
        "uring" => run_uring(&args[2]),
        m => panic!("mode {m}: epoll or uring"),
    }
}
