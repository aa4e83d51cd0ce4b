//! The threads that serve connections, and which of them serves which connection.
//!
//! Each worker is a thread with a single-threaded runtime (as nginx's worker
//! processes); the listeners, signals, reloads and store connections stay on the main
//! runtime. A connection runs on one worker at a time, so an HTTP/2 connection's
//! answers are all made before it writes, and leave together in one system call.
//!
//! Which worker ([`Balance`]): under [`Balance::Pack`] (the default), as few as the
//! load needs. A new connection goes to the first worker, in order, that was busy less
//! than half of the last [`PERIOD`]; after each period the balancer reads how long
//! each worker was busy and
//!
//! - spreads: a worker busy three quarters of the period or more, with two
//!   connections or more, hands enough of them to the least busy worker to even the
//!   two out (when that one is less than half as busy);
//! - gathers: the last worker holding connections hands them all to the first worker
//!   whose load, with its own, stays under two fifths of the period.
//!
//! Fewer workers awake means more calls per wake-up and less CPU per call (on two
//! cores, one worker spent about a fifth less per gRPC decision than two at the same
//! load); more workers awake serve more once one is busy, if there is a CPU for them.
//! So a spread that wakes a worker is a trial: for [`TRIAL`] periods after it, the
//! balancer reads how many bytes the workers read and how long their threads waited
//! for a CPU (`/proc/self/task/TID/schedstat`). Where the workers read a twentieth
//! less or more than they would have with the first one busy all the time and waited
//! for a CPU (their waits add up to [`CROWDED`] of a period or more, in two periods of
//! the trial), the cores were taken (by the clients, a sidecar or a neighbour) and the
//! second worker only took turns with the first: the moved connections go back, and
//! no spread wakes a worker for a second, then two, four, up to a minute, until one
//! pays or does no harm. During a trial and a hold, new connections go to the workers
//! already awake (busy [`AWAKE`] of a period or more), not to the one on trial.
//! (Evening out two workers already awake is no trial, and is not held.)
//! [`Balance::Spread`] hands each connection to the next worker in turn and never
//! moves it.
//!
//! A connection moves as its boxed future, sent to the other worker's runtime; its
//! socket ([`WorkerStream`]) registers again with the runtime that polls it next.
//! What a move costs: two `epoll_ctl` calls and a wake-up of the other worker.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

use crate::config::Balance;

/// How often the balancer reads the workers' load and moves connections.
pub const PERIOD: Duration = Duration::from_millis(100);

/// A worker busy less than this share of a period (in thousandths) takes new
/// connections.
const FILL: u32 = 500;
/// A worker busy this share of a period or more hands connections to an idler one.
const SPREAD: u32 = 750;
/// Two workers whose loads add up to less than this share are gathered into one.
const GATHER: u32 = 400;
/// A worker busy less than this share sleeps, whatever connections it holds (a health
/// check's or a scrape's, say): a spread onto it wakes it.
const AWAKE: u32 = 50;
/// How many periods after a spread tell whether it paid.
pub const TRIAL: u32 = 3;
/// The workers' waits for a CPU, added up, at which a period counts as crowded (in
/// thousandths of the period).
pub const CROWDED: u32 = 150;
/// How long no spread is tried after one that did not pay, in periods: at first, and
/// at most (it doubles each time one fails).
const HOLD: (u32, u32) = (10, 600);

thread_local! {
    /// The index of the worker this thread is (`usize::MAX` on any other thread).
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The bytes this worker's connections read (unset on any other thread).
    static READ: std::cell::OnceCell<Arc<AtomicU64>> = const { std::cell::OnceCell::new() };
}

fn this_worker() -> usize {
    WORKER.with(Cell::get)
}

/// The worker threads: each serves the connections handed to it, on a runtime of its
/// own, until the workers are dropped.
pub struct Workers {
    workers: Arc<[Worker]>,
    /// No spread may wake a worker now (one is on trial, or one did not pay): new
    /// connections join the workers awake.
    held: Arc<AtomicBool>,
    /// The worker a spread on trial woke (`usize::MAX`: none): new connections keep
    /// off it, so that what goes back is what the spread moved.
    woken: Arc<AtomicUsize>,
    balance: Balance,
    turn: AtomicUsize,
    stop: Option<watch::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// One worker, as the others and the balancer see it.
struct Worker {
    handle: tokio::runtime::Handle,
    /// Its busy share of the last period, in thousandths.
    load: AtomicU32,
    /// The connections it serves.
    connections: AtomicUsize,
    /// How many of its connections are asked to move, and where to.
    leaving: AtomicUsize,
    leave_to: AtomicUsize,
    /// Wakes its connections to take a leave ticket.
    leave: Notify,
    /// Connections moved onto it since start.
    moved_in: AtomicU64,
    /// Spreads that woke it on trial, and those of them that went back (the cores
    /// were taken), since start.
    tried: AtomicU64,
    sent_back: AtomicU64,
    /// Bytes its connections read since start (written by its thread only).
    read: Arc<AtomicU64>,
    /// Its thread's id, for the kernel's count of its waits for a CPU (0: unknown).
    tid: Arc<AtomicU32>,
}

/// A balancer's decision: move `count` connections from worker `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    from: usize,
    to: usize,
    count: usize,
}

impl Workers {
    /// Starts `n` worker threads (at least one), sharing connections as `balance`
    /// says. The balancer (under [`Balance::Spread`], only the load meter) runs as a
    /// task of the calling runtime, so this is called within one.
    pub fn start(n: usize, balance: Balance) -> io::Result<Workers> {
        let (stop, stopped) = watch::channel(());
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (read, tid) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU32::new(0)));
            let (read_here, tid_here) = (read.clone(), tid.clone());
            workers.push(Worker {
                handle: runtime.handle().clone(),
                load: AtomicU32::new(0),
                connections: AtomicUsize::new(0),
                leaving: AtomicUsize::new(0),
                leave_to: AtomicUsize::new(0),
                leave: Notify::new(),
                moved_in: AtomicU64::new(0),
                tried: AtomicU64::new(0),
                sent_back: AtomicU64::new(0),
                read,
                tid,
            });
            let mut stopped = stopped.clone();
            threads.push(
                std::thread::Builder::new()
                    // Short enough for the kernel's 15-byte thread names: tg-worker-0, -1, ...
                    .name(format!("tg-worker-{i}"))
                    .spawn(move || {
                        WORKER.with(|w| w.set(i));
                        READ.with(|r| r.set(read_here).ok());
                        let tid = thread_id();
                        if tid.is_none() {
                            tracing::debug!("workers: no /proc/thread-self here: a spread is never tried, it stays");
                        }
                        tid_here.store(tid.unwrap_or(0), Ordering::Relaxed);
                        runtime.block_on(async move {
                            let _ = stopped.changed().await;
                        });
                    })?,
            );
        }
        let workers: Arc<[Worker]> = workers.into();
        let held = Arc::new(AtomicBool::new(false));
        let woken = Arc::new(AtomicUsize::new(usize::MAX));
        tokio::spawn(balance_loop(
            workers.clone(),
            (held.clone(), woken.clone()),
            balance,
            stopped,
        ));
        Ok(Workers {
            workers,
            held,
            woken,
            balance,
            turn: AtomicUsize::new(0),
            stop: Some(stop),
            threads,
        })
    }

    /// Serves a connection on a worker: `serve` gets its socket, registered with the
    /// runtime that polls it, and the future it makes runs on that worker (or on
    /// another, when the balancer moves it).
    pub fn serve<F>(
        &self,
        stream: std::net::TcpStream,
        serve: impl FnOnce(WorkerStream) -> F + Send + 'static,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let at = match self.balance {
            Balance::Pack if self.held.load(Ordering::Relaxed) => place_awake(
                &self.loads(),
                &self.connections(),
                self.woken.load(Ordering::Relaxed),
            ),
            Balance::Pack => place(&self.loads()),
            Balance::Spread => self.turn.fetch_add(1, Ordering::Relaxed) % self.workers.len(),
        };
        let workers = self.workers.clone();
        workers[at].connections.fetch_add(1, Ordering::Relaxed);
        self.workers[at].handle.spawn(async move {
            let connection = Box::pin(serve(WorkerStream::unregistered(stream)));
            run(connection, at, workers).await;
        });
    }

    /// Each worker's busy share of the last period, in thousandths.
    fn loads(&self) -> Vec<u32> {
        (self.workers.iter())
            .map(|w| w.load.load(Ordering::Relaxed))
            .collect()
    }

    /// How many connections each worker serves.
    pub fn connections(&self) -> Vec<usize> {
        (self.workers.iter())
            .map(|w| w.connections.load(Ordering::Relaxed))
            .collect()
    }

    /// What each worker is doing, for the metrics (a handle that outlives no thread:
    /// it reads counters).
    pub fn stats(&self) -> WorkerStats {
        WorkerStats(self.workers.clone())
    }
}

impl Drop for Workers {
    /// Stops the workers (what they still run is dropped) and waits for their threads.
    fn drop(&mut self) {
        drop(self.stop.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

type Connection = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `connection` on worker `at` to its end, or until it is asked to move; then it
/// goes on, as it is, on the other worker.
fn run(mut connection: Connection, at: usize, workers: Arc<[Worker]>) -> Connection {
    Box::pin(async move {
        let here = &workers[at];
        loop {
            tokio::select! {
                biased;
                () = &mut connection => break,
                () = here.leave.notified() => {
                    let ticket = here.leaving.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                        n.checked_sub(1)
                    });
                    let to = here.leave_to.load(Ordering::SeqCst);
                    if ticket.is_err() || to == at || to >= workers.len() {
                        continue;
                    }
                    here.connections.fetch_sub(1, Ordering::Relaxed);
                    workers[to].connections.fetch_add(1, Ordering::Relaxed);
                    workers[to].moved_in.fetch_add(1, Ordering::Relaxed);
                    let moved = run(connection, to, workers.clone());
                    workers[to].handle.spawn(moved);
                    return;
                }
            }
        }
        here.connections.fetch_sub(1, Ordering::Relaxed);
    })
}

fn ask_to_move(workers: &[Worker], m: Move) {
    let from = &workers[m.from];
    from.leave_to.store(m.to, Ordering::SeqCst);
    from.leaving.store(m.count, Ordering::SeqCst);
    from.leave.notify_waiters();
}

/// Every [`PERIOD`]: each worker's load from its busy time, then (packing) at most
/// one move.
async fn balance_loop(
    workers: Arc<[Worker]>,
    (held, woken): (Arc<AtomicBool>, Arc<AtomicUsize>),
    balance: Balance,
    mut stopped: watch::Receiver<()>,
) {
    let busy = |w: &Worker| w.handle.metrics().worker_total_busy_duration(0);
    let read = |w: &Worker| w.read.load(Ordering::Relaxed);
    let waited = |ws: &[Worker]| {
        ws.iter()
            .map(|w| cpu_wait(w.tid.load(Ordering::Relaxed)))
            .sum()
    };
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut then = ticks.tick().await;
    let mut busy_then: Vec<Duration> = workers.iter().map(busy).collect();
    let mut read_then: Vec<u64> = workers.iter().map(read).collect();
    let mut waited_then: Option<Duration> = waited(&workers);
    let mut packer = Packer::default();
    loop {
        let now = tokio::select! {
            now = ticks.tick() => now,
            _ = stopped.changed() => return,
        };
        let wall = now.duration_since(then).as_nanos().max(1);
        let share = |d: Duration| (d.as_nanos() * 1000 / wall).min(1000) as u32;
        let mut loads = Vec::with_capacity(workers.len());
        let mut connections = Vec::with_capacity(workers.len());
        let mut reads = Vec::with_capacity(workers.len());
        for ((w, before), read_before) in workers.iter().zip(&mut busy_then).zip(&mut read_then) {
            let b = busy(w);
            let load = share(b.saturating_sub(*before));
            *before = b;
            let r = read(w);
            // A rate (bytes a [`PERIOD`]): a period the balancer woke late for is longer.
            let per_period = u128::from(r.wrapping_sub(*read_before)) * PERIOD.as_nanos() / wall;
            reads.push(u64::try_from(per_period).unwrap_or(u64::MAX));
            *read_before = r;
            w.load.store(load, Ordering::Relaxed);
            // Tickets of the last period that no connection took are void.
            w.leaving.store(0, Ordering::SeqCst);
            loads.push(load);
            connections.push(w.connections.load(Ordering::Relaxed));
        }
        if balance == Balance::Spread {
            then = now;
            continue;
        }
        let waited_now = waited(&workers);
        let period = Period {
            loads: &loads,
            connections: &connections,
            reads: &reads,
            waited: waited_now
                .zip(waited_then)
                .map(|(n, t)| share(n.saturating_sub(t))),
        };
        (then, waited_then) = (now, waited_now);
        let m = packer.next(&period);
        // While a spread is on trial too: what the workers read then is the verdict's.
        let on_trial = packer.trial.as_ref().map_or(usize::MAX, |t| t.spread.to);
        woken.store(on_trial, Ordering::Relaxed);
        held.store(packer.hold > 0 || packer.trial.is_some(), Ordering::Relaxed);
        if let Some(m) = m {
            if packer.sent_back {
                workers[m.from].sent_back.fetch_add(1, Ordering::Relaxed);
            } else if packer.trial.is_some() {
                workers[m.to].tried.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!(
                "workers: moving {} connection(s) from worker {} to {} (loads {loads:?}, connections {connections:?}, bytes read {reads:?}, waited {:?})",
                m.count,
                m.from,
                m.to,
                period.waited,
            );
            ask_to_move(&workers, m);
        }
    }
}

/// This thread's id as the kernel numbers it (Linux; `None` elsewhere).
fn thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// How long thread `tid` of this process has waited for a CPU since it started: the
/// second figure of its `schedstat` (`None` where the kernel does not say).
fn cpu_wait(tid: u32) -> Option<Duration> {
    if tid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let ns = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// What the workers would have read in period `p` had its busiest worker been busy
/// all the time (0 where none was busy enough to tell: below [`SPREAD`]).
fn alone(p: &Period<'_>) -> u64 {
    let Some(hot) = (0..p.loads.len()).max_by_key(|&i| p.loads[i]) else {
        return 0;
    };
    if p.loads[hot] < SPREAD {
        return 0;
    }
    let busy = p.reads[hot] * 1000 / u64::from(p.loads[hot]);
    p.reads.iter().sum::<u64>() - p.reads[hot] + busy
}

/// One period as the balancer read it.
struct Period<'a> {
    /// Each worker's busy share, in thousandths.
    loads: &'a [u32],
    /// Each worker's connections.
    connections: &'a [usize],
    /// Bytes each worker read, over a [`PERIOD`] (the period may have been longer).
    reads: &'a [u64],
    /// The workers' waits for a CPU, added up, in thousandths of the period (`None`
    /// where the kernel does not say).
    waited: Option<u32>,
}

/// The packing balancer's memory between periods: the spread on trial, and how long
/// no spread is tried after one that did not pay.
#[derive(Debug, Default)]
struct Packer {
    trial: Option<Trial>,
    /// The last move was a spread on trial going back.
    sent_back: bool,
    /// Periods left without a spread.
    hold: u32,
    /// The next hold, once a spread does not pay.
    next_hold: u32,
}

#[derive(Debug)]
struct Trial {
    spread: Move,
    /// Bytes a period the workers would read with the busy one busy all the time
    /// (what it read in the period before, over its busy share; the others' as
    /// they were).
    before: u64,
    /// Bytes read since, periods since, and the crowded ones among them.
    read: u64,
    periods: u32,
    crowded: u32,
}

impl Packer {
    /// The move after this period, if any.
    fn next(&mut self, p: &Period<'_>) -> Option<Move> {
        self.sent_back = false;
        if let Some(t) = &mut self.trial {
            t.read += p.reads.iter().sum::<u64>();
            t.periods += 1;
            t.crowded += u32::from(p.waited.is_some_and(|w| w >= CROWDED));
            if t.periods < TRIAL {
                return None;
            }
            let t = self.trial.take()?;
            // Paid: no less read (within a twentieth, a period's noise) than with the
            // first worker busy all the time. Harmless: the CPUs were free (the load
            // did not need more, and the second worker cost nobody a turn).
            let paid = t.read * 20 >= t.before * u64::from(TRIAL) * 19;
            tracing::debug!(
                "workers: spread tried: {} B a period before (the busy worker busy all the time), {} B after, {} of {TRIAL} periods crowded",
                t.before,
                t.read / u64::from(TRIAL),
                t.crowded
            );
            if paid || t.crowded < 2 {
                self.next_hold = HOLD.0;
                return None;
            }
            self.hold = self.next_hold.max(HOLD.0);
            self.next_hold = (self.hold * 2).min(HOLD.1);
            let back = t.spread.count.min(p.connections[t.spread.to]);
            self.sent_back = back > 0;
            return (back > 0).then_some(Move {
                from: t.spread.to,
                to: t.spread.from,
                count: back,
            });
        }
        // What the workers would have read with the busiest one busy all the time.
        let before = alone(p);
        let held = self.hold > 0;
        self.hold = self.hold.saturating_sub(1);
        if let Some(m) = spread(p.loads, p.connections) {
            if p.loads[m.to] >= AWAKE && p.connections[m.to] > 0 {
                // Evening out two workers already awake: no worker is woken (a
                // worker sent back its connections still shows the period's work).
                return Some(m);
            }
            if !held {
                self.trial = Some(Trial {
                    spread: m,
                    before,
                    read: 0,
                    periods: 0,
                    crowded: 0,
                });
                return Some(m);
            }
        }
        gather(p.loads, p.connections)
    }
}

/// What the workers are doing, read at any time.
#[derive(Clone)]
pub struct WorkerStats(Arc<[Worker]>);

/// One worker's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerStat {
    /// The connections it serves now.
    pub connections: usize,
    /// Its busy share of the last [`PERIOD`], 0 to 1.
    pub busy: f64,
    /// Connections moved onto it since start.
    pub moved_in: u64,
    /// Spreads that woke it on trial since start.
    pub tried: u64,
    /// Those of them that went back: the cores were taken.
    pub sent_back: u64,
}

impl WorkerStats {
    /// Each worker's figures, by index.
    pub fn read(&self) -> Vec<WorkerStat> {
        (self.0.iter())
            .map(|w| WorkerStat {
                connections: w.connections.load(Ordering::Relaxed),
                busy: f64::from(w.load.load(Ordering::Relaxed)) / 1000.0,
                moved_in: w.moved_in.load(Ordering::Relaxed),
                tried: w.tried.load(Ordering::Relaxed),
                sent_back: w.sent_back.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// The worker a new connection goes to while no worker may be woken: as [`place`]
/// among the workers awake but `except` (a spread's on trial); else the first holding
/// connections, else the first.
fn place_awake(loads: &[u32], connections: &[usize], except: usize) -> usize {
    let open = |i: usize| connections[i] > 0 && i != except;
    let awake: Vec<u32> = (0..loads.len())
        .map(|i| match open(i) && loads[i] >= AWAKE {
            true => loads[i],
            false => u32::MAX,
        })
        .collect();
    match awake.iter().any(|&l| l != u32::MAX) {
        true => place(&awake),
        false => (0..loads.len()).find(|&i| open(i)).unwrap_or(0),
    }
}

/// The worker a new connection goes to: the first with room, else the least busy.
fn place(loads: &[u32]) -> usize {
    loads
        .iter()
        .position(|&l| l < FILL)
        .unwrap_or_else(|| (0..loads.len()).min_by_key(|&i| (loads[i], i)).unwrap_or(0))
}

/// The move a balancer makes after a period with these loads (thousandths) and
/// connection counts, if any (see the module doc): a spread, else a gather.
#[cfg(test)]
fn plan(loads: &[u32], connections: &[usize]) -> Option<Move> {
    spread(loads, connections).or_else(|| gather(loads, connections))
}

/// A busy worker's connections evened out with the least busy one, if one is busy.
fn spread(loads: &[u32], connections: &[usize]) -> Option<Move> {
    let n = loads.len();
    let hot = (0..n).max_by_key(|&i| (loads[i], std::cmp::Reverse(i)))?;
    let cold = (0..n).min_by_key(|&i| (loads[i], i))?;
    if loads[hot] >= SPREAD && connections[hot] >= 2 && loads[cold] * 2 < loads[hot] {
        let (h, c) = (u64::from(loads[hot]), u64::from(loads[cold]));
        let even = (h - c) * connections[hot] as u64 / (2 * h);
        let count = (even as usize).clamp(1, connections[hot] - 1);
        return Some(Move {
            from: hot,
            to: cold,
            count,
        });
    }
    None
}

/// The last worker's connections handed to the first with room for its load, if any.
fn gather(loads: &[u32], connections: &[usize]) -> Option<Move> {
    let last = (0..loads.len()).rev().find(|&i| connections[i] > 0)?;
    let to = (0..last).find(|&i| loads[i] + loads[last] < GATHER)?;
    Some(Move {
        from: last,
        to,
        count: connections[last],
    })
}

/// A connection's TCP socket that follows it from worker to worker: it registers with
/// the runtime of the thread that polls it (a socket belongs to the runtime that
/// registered it; polled from another, that one's thread would have to wake this one
/// for every read).
pub struct WorkerStream {
    state: State,
}

enum State {
    /// Not registered with any runtime yet (or between two).
    Plain(std::net::TcpStream),
    /// Registered with the runtime of worker `at` (`usize::MAX`: not a worker's).
    Registered { stream: TcpStream, at: usize },
    /// Lost while moving.
    Broken,
}

impl WorkerStream {
    /// A socket registered with the runtime that first polls it.
    pub fn unregistered(stream: std::net::TcpStream) -> WorkerStream {
        WorkerStream {
            state: State::Plain(stream),
        }
    }

    /// A socket already registered with this thread's runtime.
    pub fn registered(stream: TcpStream) -> WorkerStream {
        WorkerStream {
            state: State::Registered {
                stream,
                at: this_worker(),
            },
        }
    }

    /// The socket, registered with this thread's runtime.
    fn here(&mut self) -> io::Result<&mut TcpStream> {
        let here = this_worker();
        let moved = !matches!(self.state, State::Registered { at, .. } if at == here);
        if moved {
            let plain = match std::mem::replace(&mut self.state, State::Broken) {
                State::Plain(s) => s,
                State::Registered { stream, .. } => stream.into_std()?,
                State::Broken => return Err(broken()),
            };
            self.state = State::Registered {
                stream: TcpStream::from_std(plain)?,
                at: here,
            };
        }
        match &mut self.state {
            State::Registered { stream, .. } => Ok(stream),
            _ => Err(broken()),
        }
    }

    /// Whether the socket writes vectored (it does once registered).
    fn vectored(&self) -> bool {
        match &self.state {
            State::Registered { stream, .. } => stream.is_write_vectored(),
            _ => true,
        }
    }
}

fn broken() -> io::Error {
    io::Error::other("the connection's socket was lost moving between workers")
}

/// Polls `f` on the socket registered here, or fails with why it cannot be.
fn on_socket<T>(
    s: &mut WorkerStream,
    f: impl FnOnce(Pin<&mut TcpStream>) -> Poll<io::Result<T>>,
) -> Poll<io::Result<T>> {
    match s.here() {
        Ok(stream) => f(Pin::new(stream)),
        Err(e) => Poll::Ready(Err(e)),
    }
}

impl AsyncRead for WorkerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = on_socket(self.get_mut(), |s| s.poll_read(cx, buf));
        if let Poll::Ready(Ok(())) = read {
            let n = (buf.filled().len() - before) as u64;
            // Only this thread writes its count: a load and a store, no locked add.
            READ.with(|r| {
                r.get()
                    .map(|r| r.store(r.load(Ordering::Relaxed) + n, Ordering::Relaxed))
            });
        }
        read
    }
}

impl AsyncWrite for WorkerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_socket(self.get_mut(), |s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_socket(self.get_mut(), |s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_socket(self.get_mut(), |s| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_socket(self.get_mut(), |s| s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_connections_fill_the_first_worker_with_room() {
        assert_eq!(place(&[0, 0, 0]), 0);
        assert_eq!(place(&[499, 0, 0]), 0);
        assert_eq!(place(&[500, 0, 0]), 1);
        assert_eq!(place(&[900, 600, 100]), 2);
        // None with room: the least busy.
        assert_eq!(place(&[900, 600, 700]), 1);
    }

    #[test]
    fn a_busy_worker_hands_enough_connections_to_even_out() {
        // Busy 100 % with 32 connections, the other idle: half of them move.
        assert_eq!(
            plan(&[1000, 0], &[32, 0]),
            Some(Move {
                from: 0,
                to: 1,
                count: 16
            })
        );
        // Busy 80 % against 20 %: (800 - 200) / 1600 of 8 = 3.
        assert_eq!(
            plan(&[800, 200], &[8, 2]),
            Some(Move {
                from: 0,
                to: 1,
                count: 3
            })
        );
        // At least one moves, and never the last one.
        assert_eq!(plan(&[760, 0], &[2, 0]).map(|m| m.count), Some(1));
        assert_eq!(
            plan(&[1000, 0], &[1, 0]),
            None,
            "one connection: moving it helps nothing"
        );
        // Below the spread mark, or the other nearly as busy: nothing moves.
        assert_eq!(plan(&[740, 0], &[4, 0]), None);
        assert_eq!(plan(&[900, 500], &[4, 4]), None);
    }

    #[test]
    fn quiet_workers_are_gathered_into_the_first_with_room() {
        assert_eq!(
            plan(&[100, 150, 50], &[2, 3, 1]),
            Some(Move {
                from: 2,
                to: 0,
                count: 1
            })
        );
        // The first cannot take it; the second can.
        assert_eq!(
            plan(&[380, 100, 50], &[4, 3, 1]),
            Some(Move {
                from: 2,
                to: 1,
                count: 1
            })
        );
        // Together they would be too busy: nothing moves.
        assert_eq!(plan(&[300, 200], &[4, 3]), None);
        // All on the first already: nothing to gather.
        assert_eq!(plan(&[300, 0, 0], &[4, 0, 0]), None);
    }

    /// A period of workers with these loads, connections and bytes read, `waited`
    /// thousandths of it spent waiting for a CPU.
    fn period<'a>(
        loads: &'a [u32],
        connections: &'a [usize],
        reads: &'a [u64],
        waited: u32,
    ) -> Period<'a> {
        Period {
            loads,
            connections,
            reads,
            waited: Some(waited),
        }
    }

    #[test]
    fn a_spread_that_buys_nothing_on_crowded_cores_goes_back_and_is_held_off() {
        let mut packer = Packer::default();
        let busy = period(&[1000, 0], &[32, 0], &[1000, 0], 0);
        let spread = Some(Move {
            from: 0,
            to: 1,
            count: 16,
        });
        let back = Some(Move {
            from: 1,
            to: 0,
            count: 16,
        });
        for hold in [10, 20, 40] {
            assert_eq!(packer.next(&busy), spread);
            // Two workers, each busy, reading less than one did, waiting for a CPU.
            let crowded = period(&[600, 500], &[16, 16], &[400, 300], 300);
            assert_eq!(packer.next(&crowded), None);
            assert_eq!(packer.next(&crowded), None);
            assert_eq!(packer.next(&crowded), back, "after {TRIAL} periods");
            assert!(packer.sent_back);
            // The next period still shows the second worker's work, not its
            // connections: a spread onto it would wake it, and is held.
            let after = period(&[900, 60], &[32, 0], &[700, 50], 300);
            assert_eq!(packer.next(&after), None);
            for _ in 1..hold {
                assert_eq!(packer.next(&busy), None, "held off for {hold} periods");
            }
        }
        assert_eq!(packer.next(&busy), spread);
        // Only the connections it moved go back (new ones joined the second worker).
        let crowded = period(&[600, 500], &[16, 36], &[400, 300], 300);
        for _ in 1..TRIAL {
            packer.next(&crowded);
        }
        assert_eq!(packer.next(&crowded), back);
    }

    #[test]
    fn a_spread_stays_where_it_pays_or_the_cpus_were_free() {
        // 800 B at 80 % busy: 1000 B busy all the time.
        let busy = period(&[800, 0], &[32, 0], &[800, 0], 0);
        for (after, why) in [
            (
                period(&[700, 700], &[16, 16], &[500, 500], 400),
                "paid, crowded or not",
            ),
            // The load needed no more, and nobody waited for a CPU.
            (period(&[400, 400], &[16, 16], &[400, 400], 20), "free CPUs"),
            (
                Period {
                    waited: None,
                    ..period(&[400, 400], &[16, 16], &[250, 250], 0)
                },
                "the kernel does not say",
            ),
        ] {
            let mut packer = Packer::default();
            assert!(packer.next(&busy).is_some(), "{why}");
            for _ in 0..TRIAL {
                assert_eq!(packer.next(&after), None, "{why}");
            }
            assert_eq!(packer.hold, 0, "{why}");
        }
        // One crowded period of three is not a verdict.
        let mut packer = Packer::default();
        packer.next(&busy);
        packer.next(&period(&[700, 700], &[16, 16], &[250, 250], 400));
        packer.next(&period(&[700, 700], &[16, 16], &[250, 250], 100));
        let last = period(&[700, 700], &[16, 16], &[250, 250], 100);
        assert_eq!(packer.next(&last), None);
        // Evening out two workers already awake wakes none: no trial.
        let mut packer = Packer::default();
        let uneven = period(&[1000, 300], &[20, 4], &[900, 300], 500);
        assert!(packer.next(&uneven).is_some());
        assert!(packer.trial.is_none());
        // A worker that holds only idle connections sleeps: a spread onto it is one.
        let idle = period(&[1000, 10], &[20, 2], &[900, 1], 0);
        assert!(packer.next(&idle).is_some());
        assert!(packer.trial.is_some());
    }

    #[test]
    fn held_off_spreads_still_gather() {
        let mut packer = Packer {
            hold: 5,
            ..Packer::default()
        };
        let quiet = period(&[100, 100], &[4, 4], &[50, 50], 0);
        assert_eq!(
            packer.next(&quiet),
            Some(Move {
                from: 1,
                to: 0,
                count: 4
            })
        );
        assert_eq!(packer.hold, 4);
        // Evening out two workers already awake is not held either.
        let uneven = period(&[1000, 300], &[20, 4], &[900, 300], 500);
        assert!(packer.next(&uneven).is_some());
        assert_eq!(packer.hold, 3);
    }

    #[test]
    fn held_new_connections_join_the_workers_awake() {
        let none = usize::MAX;
        assert_eq!(place_awake(&[900, 0, 0], &[32, 0, 0], none), 0);
        assert_eq!(place_awake(&[900, 200, 0], &[32, 4, 0], none), 1);
        let least_busy = place_awake(&[900, 800, 0], &[32, 4, 0], none);
        assert_eq!(least_busy, 1);
        assert_eq!(place_awake(&[0, 0], &[0, 0], none), 0);
        // A scrape's idle connection does not make a worker awake.
        assert_eq!(place_awake(&[900, 20], &[32, 2], none), 0);
        // Nor is the worker a spread on trial woke open to new connections.
        assert_eq!(place_awake(&[900, 600], &[16, 16], 1), 0);
        assert_eq!(place_awake(&[20, 600], &[1, 16], 1), 0);
    }

    #[test]
    fn a_spread_that_reads_a_little_less_stays() {
        // 1000 B a period on one worker; 960 B on two, crowded: within a twentieth.
        let mut packer = Packer::default();
        assert!(packer
            .next(&period(&[1000, 0], &[32, 0], &[1000, 0], 0))
            .is_some());
        let after = period(&[700, 700], &[16, 16], &[480, 480], 400);
        for _ in 0..TRIAL {
            assert_eq!(packer.next(&after), None);
        }
        assert_eq!(packer.hold, 0);
    }

    /// Echoes lines, answering each with the worker thread that read it.
    async fn echo_where(stream: WorkerStream) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let mut lines = BufReader::new(stream);
        let mut line = String::new();
        while lines.read_line(&mut line).await.unwrap_or(0) > 0 {
            let answer = format!("{} {}", this_worker(), line);
            if lines.get_mut().write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            line.clear();
        }
    }

    #[tokio::test]
    async fn a_connection_moves_to_another_worker_and_goes_on_there() {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let workers = Workers::start(2, Balance::Spread).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for s in [&client, &server] {
            s.set_nonblocking(true).unwrap();
        }
        workers.serve(server, echo_where);
        let mut client = BufReader::new(TcpStream::from_std(client).unwrap());
        let mut ask = async |line: &str| {
            client.get_mut().write_all(line.as_bytes()).await.unwrap();
            let mut answer = String::new();
            client.read_line(&mut answer).await.unwrap();
            answer
        };
        assert_eq!(ask("one\n").await, "0 one\n");
        assert_eq!(workers.connections(), [1, 0]);
        ask_to_move(
            &workers.workers,
            Move {
                from: 0,
                to: 1,
                count: 1,
            },
        );
        let mut moved = false;
        for _ in 0..100 {
            if workers.connections() == [0, 1] {
                moved = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(moved, "{:?}", workers.connections());
        // Served on worker 1 now, its socket registered there.
        assert_eq!(ask("two\n").await, "1 two\n");
        assert_eq!(ask("three\n").await, "1 three\n");
        drop(client);
        for _ in 0..100 {
            if workers.connections() == [0, 0] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "the connection's end was not counted: {:?}",
            workers.connections()
        );
    }
}
