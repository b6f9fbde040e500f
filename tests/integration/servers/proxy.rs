//! A fault-injecting TCP proxy on 127.0.0.1 in front of one upstream port, with std threads only.
//!
//! One acceptor thread, and two pump threads per connection (client to server, server to client).
//! Every loop is bounded: reads time out every [`TICK`] to look at the stop and down flags, writes
//! time out after [`WRITE_TIMEOUT`], and Drop shuts every socket down before joining the threads.
//!
//! Latency is added per request turn, not per chunk: the first bytes a client sends after the
//! server last spoke (or the first of a connection) wait `latency` before they go on; the rest of
//! that request and every response byte pass at full speed. So each HTTP request on a connection
//! sees at least `latency` more, and large uploads and downloads keep their throughput.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::addr;

const TICK: Duration = Duration::from_millis(50);
const WRITE_TIMEOUT: Duration = Duration::from_secs(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What went through a [`Proxy`] since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted and joined to the upstream.
    pub connections: u64,
    /// Client connections reset at once: the proxy was down, or the upstream refused.
    pub refused: u64,
    /// Bytes taken from clients to forward to the server (requests).
    pub bytes_to_server: u64,
    /// Bytes taken from the server to forward to clients (responses).
    pub bytes_to_client: u64,
}

struct Shared {
    upstream: u16,
    stop: AtomicBool,
    down: AtomicBool,
    latency_ns: AtomicU64,
    connections: AtomicU64,
    refused: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    live: Mutex<Vec<Conn>>,
}

/// Clones of one proxied connection's sockets (to cut it) and its pump threads.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    pumps: [JoinHandle<()>; 2],
}

impl Conn {
    fn cut(&self) {
        reset_on_close(&self.client);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
    fn finished(&self) -> bool {
        self.pumps.iter().all(|h| h.is_finished())
    }
}

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a fresh port of 127.0.0.1 that forwards to 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy: bind 127.0.0.1:0");
        let port = listener.local_addr().expect("proxy: local_addr").port();
        let shared = Arc::new(Shared {
            upstream: upstream_port,
            stop: AtomicBool::new(false),
            down: AtomicBool::new(false),
            latency_ns: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            live: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || accept_loop(listener, sh))
            .expect("proxy: spawn acceptor");
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn upstream_port(&self) -> u16 {
        self.shared.upstream
    }

    /// Delay the start of each request (client-to-server turn) by `latency`; zero turns it off.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_ns
            .store(latency.as_nanos() as u64, SeqCst);
    }

    /// While down, open connections are cut (reset) and new ones are reset as soon as accepted.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, SeqCst);
        if down {
            self.cut();
        }
    }

    /// Cut every open connection once (the client sees it closed or reset mid-request); new
    /// connections go through as before unless the proxy is down.
    pub fn cut(&self) {
        let live = self.shared.live.lock().unwrap();
        for c in live.iter() {
            c.cut();
        }
    }

    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            connections: s.connections.load(SeqCst),
            refused: s.refused.load(SeqCst),
            bytes_to_server: s.bytes_up.load(SeqCst),
            bytes_to_client: s.bytes_down.load(SeqCst),
        }
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        let live = self.shared.live.lock().unwrap();
        live.iter().filter(|c| !c.finished()).count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // Wake the acceptor's blocking accept with one connection of our own.
        let _ = TcpStream::connect_timeout(&addr(self.port), Duration::from_secs(1));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let conns = std::mem::take(&mut *self.shared.live.lock().unwrap());
        for c in &conns {
            c.cut();
        }
        for c in conns {
            for h in c.pumps {
                let _ = h.join();
            }
        }
    }
}

/// SO_LINGER {on, 0}: closing the socket then sends RST instead of FIN.
fn reset_on_close(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a properly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    for incoming in listener.incoming() {
        if sh.stop.load(SeqCst) {
            break;
        }
        let Ok(client) = incoming else { continue };
        // Join the pumps of connections that are over.
        {
            let mut live = sh.live.lock().unwrap();
            let (done, open): (Vec<Conn>, Vec<Conn>) = live.drain(..).partition(Conn::finished);
            *live = open;
            drop(live);
            for c in done {
                for h in c.pumps {
                    let _ = h.join();
                }
            }
        }
        if sh.down.load(SeqCst) {
            sh.refused.fetch_add(1, SeqCst);
            reset_on_close(&client);
            continue; // dropped: RST
        }
        let server = match TcpStream::connect_timeout(&addr(sh.upstream), CONNECT_TIMEOUT) {
            Ok(s) => s,
            Err(_) => {
                sh.refused.fetch_add(1, SeqCst);
                reset_on_close(&client);
                continue;
            }
        };
        if let Err(e) = join(&sh, client, server) {
            eprintln!("proxy: could not set up a connection: {e}");
        }
    }
}

fn join(sh: &Arc<Shared>, client: TcpStream, server: TcpStream) -> std::io::Result<()> {
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(TICK))?;
        s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    }
    sh.connections.fetch_add(1, SeqCst);
    // Who spoke last on this connection: 0 nobody yet, 1 the client, 2 the server.
    let turn = Arc::new(AtomicU8::new(0));
    let up = {
        let (sh, from, to, turn) = (
            sh.clone(),
            client.try_clone()?,
            server.try_clone()?,
            turn.clone(),
        );
        std::thread::Builder::new()
            .name("proxy-up".into())
            .spawn(move || pump(&sh, from, to, true, &turn))?
    };
    let down = {
        let (sh, from, to, turn) = (sh.clone(), server.try_clone()?, client.try_clone()?, turn);
        std::thread::Builder::new()
            .name("proxy-down".into())
            .spawn(move || pump(&sh, from, to, false, &turn))?
    };
    sh.live.lock().unwrap().push(Conn {
        client,
        server,
        pumps: [up, down],
    });
    Ok(())
}

fn pump(sh: &Shared, mut from: TcpStream, mut to: TcpStream, upward: bool, turn: &AtomicU8) {
    let mut buf = vec![0u8; 256 * 1024];
    let kill = |from: &TcpStream, to: &TcpStream| {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    };
    loop {
        if sh.stop.load(SeqCst) || sh.down.load(SeqCst) {
            return kill(&from, &to);
        }
        let n = match from.read(&mut buf) {
            Ok(0) => {
                // Half-close: the other side learns that no more is coming.
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => return kill(&from, &to),
        };
        if upward {
            if turn.swap(1, SeqCst) != 1 {
                let latency = Duration::from_nanos(sh.latency_ns.load(SeqCst));
                let until = Instant::now() + latency;
                while let Some(left) = until
                    .checked_duration_since(Instant::now())
                    .filter(|d| !d.is_zero())
                {
                    if sh.stop.load(SeqCst) || sh.down.load(SeqCst) {
                        return kill(&from, &to);
                    }
                    std::thread::sleep(left.min(TICK));
                }
            }
        } else {
            turn.store(2, SeqCst);
        }
        // Counted before the write: once the peer holds the bytes it may act on them (a client
        // exits, a test reads the stats) before this thread runs again.
        let counter = if upward { &sh.bytes_up } else { &sh.bytes_down };
        counter.fetch_add(n as u64, SeqCst);
        if to.write_all(&buf[..n]).is_err() {
            return kill(&from, &to);
        }
    }
}
