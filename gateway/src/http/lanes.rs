//! Thread-per-core serving: "lanes", one thread each with its own single-threaded tokio runtime
//! (nginx's worker processes, or Seastar's shards, in one process). An accepted connection is
//! handed to the lane with the fewest connections and lives there to its end: its requests, the
//! handler's work and the upstream connections the handler uses all run on that one thread, so a
//! request is served without a wake-up crossing threads. On a work-stealing runtime a proxied
//! request hops between workers several times (the client connection's task, the upstream
//! client's connection task, the handler), each hop a futex wake-up and a cache-cold thread;
//! measured on 2 cores that was most of the gateway's added latency (BENCHMARKS.md, "The
//! gateway's own cost").
//!
//! The upstream clients keep one connection pool per lane ([`crate::http::client::Client`] asks
//! [`current`] which lane it is on), so an upstream connection is only ever used by the lane
//! that opened it. Work too long for a lane (a very large prompt's tokenization, template
//! uploads, database calls) goes to the blocking pool, as it did before.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

thread_local! {
    static LANE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The most lanes any [`Lanes`] of this process has started: how many connection pools an
/// upstream client keeps ([`crate::http::client::Client`]).
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// The lane this thread is, if it is one.
pub fn current() -> Option<usize> {
    LANE.with(Cell::get)
}

/// How many lanes this process has started (the largest set): 0 without lanes.
pub fn started() -> usize {
    STARTED.load(Ordering::Relaxed)
}

struct Lane {
    handle: tokio::runtime::Handle,
    /// Connections living on this lane now.
    connections: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How often a lane's anchor timer fires ([`anchor`]).
const ANCHOR_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// A timer always pending on the lane's clock, never doing anything. Tokio's time driver
/// unparks its thread — a write to the runtime's eventfd, and one more pass through epoll —
/// whenever a timer is registered earlier than the driver's next wake-up, and a driver that
/// parked with no timer at all has none: every request's upstream timeout then cost a system
/// call (`strace`: one `write` a request). With this timer at most a second away, timeouts of
/// seconds and more register silently. It wakes the lane once a second.
async fn anchor() {
    let mut tick = tokio::time::interval(ANCHOR_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// The serving threads. Dropping it stops them (what still runs on them is dropped).
pub struct Lanes {
    lanes: Vec<Lane>,
    /// Where the search for the least-loaded lane starts (round robin among equals).
    next: AtomicUsize,
}

/// One lane per CPU core this process may use.
pub fn per_core() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Lanes {
    /// Starts `n` (at least 1) lanes, threads named `cachet-io-{i}`.
    pub fn start(n: usize) -> std::io::Result<Arc<Lanes>> {
        let n = n.max(1);
        let mut lanes = Vec::with_capacity(n);
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = rt.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("cachet-io-{i}"))
                .spawn(move || {
                    LANE.with(|l| l.set(Some(i)));
                    // The runtime runs its tasks while this waits; a dropped sender stops it too.
                    rt.block_on(async {
                        tokio::select! {
                            _ = stopped => {}
                            _ = anchor() => {}
                        }
                    });
                })?;
            lanes.push(Lane {
                handle,
                connections: Arc::new(AtomicUsize::new(0)),
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        STARTED.fetch_max(n, Ordering::Relaxed);
        Ok(Arc::new(Lanes {
            lanes,
            next: AtomicUsize::new(0),
        }))
    }

    /// Connections on each lane now.
    #[cfg(test)]
    fn load(&self) -> Vec<usize> {
        self.lanes
            .iter()
            .map(|l| l.connections.load(Ordering::Relaxed))
            .collect()
    }

    /// Serves `stream` with `serve` on the lane with the fewest connections, counted there
    /// until it ends. The socket is registered with that lane's own reactor (a socket accepted
    /// on another runtime would have its readiness delivered there, and a wake-up sent across
    /// threads for every read and write).
    pub fn spawn_connection<S, F>(&self, stream: tokio::net::TcpStream, serve: S)
    where
        S: FnOnce(tokio::net::TcpStream) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let std = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "an accepted connection could not leave the accepting runtime");
                return;
            }
        };
        let n = self.lanes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let lane = (0..n)
            .map(|k| &self.lanes[(start + k) % n])
            .min_by_key(|l| l.connections.load(Ordering::Relaxed))
            .expect("at least one lane");
        let count = lane.connections.clone();
        count.fetch_add(1, Ordering::Relaxed);
        lane.handle.spawn(async move {
            struct Leaving(Arc<AtomicUsize>);
            impl Drop for Leaving {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            let _leaving = Leaving(count);
            match tokio::net::TcpStream::from_std(std) {
                Ok(stream) => serve(stream).await,
                Err(e) => {
                    tracing::debug!(error = %e, "registering a connection on its lane failed")
                }
            }
        });
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        for l in &mut self.lanes {
            drop(l.stop.take());
        }
        for l in &mut self.lanes {
            if let Some(t) = l.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_loaded_lane_and_are_served_there_to_the_end() {
        let lanes = Lanes::start(2).unwrap();
        assert!(started() >= 2);
        assert_eq!(current(), None, "the test's thread is no lane");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut holds = Vec::new();
        let mut clients = Vec::new();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            for _ in 0..4 {
                clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
                let (stream, _) = listener.accept().await.unwrap();
                let (hold, held) = tokio::sync::oneshot::channel::<()>();
                holds.push(hold);
                let tx = tx.clone();
                lanes.spawn_connection(stream, move |mut stream| async move {
                    use tokio::io::AsyncReadExt;
                    let before = (current(), std::thread::current().id());
                    let _ = held.await;
                    // The socket works on the lane's own reactor: it reads the client's byte.
                    let mut b = [0u8; 1];
                    stream.read_exact(&mut b).await.unwrap();
                    assert_eq!(before, (current(), std::thread::current().id()));
                    tx.send((current().unwrap(), b[0])).unwrap();
                });
            }
        });
        assert_eq!(lanes.load(), vec![2, 2], "four connections, two a lane");
        rt.block_on(async {
            use tokio::io::AsyncWriteExt;
            for (i, c) in clients.iter_mut().enumerate() {
                c.write_all(&[i as u8]).await.unwrap();
            }
        });
        drop(holds);
        let mut seen: Vec<(usize, u8)> = (0..4).map(|_| rx.recv().unwrap()).collect();
        seen.sort();
        let lanes_seen: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(lanes_seen, vec![0, 0, 1, 1]);
        let mut bytes: Vec<u8> = seen.iter().map(|s| s.1).collect();
        bytes.sort();
        assert_eq!(bytes, vec![0, 1, 2, 3]);
        // Each one's end is counted.
        let t0 = std::time::Instant::now();
        while lanes.load() != vec![0, 0] {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5));
            std::thread::yield_now();
        }
        drop(lanes); // stops and joins the threads
    }

    #[test]
    fn there_is_a_lane_per_core_and_at_least_one() {
        assert!(per_core() >= 1);
    }
}
